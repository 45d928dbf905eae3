"""`python -m hippo_gpu.cli COMMAND ...`: the same app as the `hippo-gpu` script."""

from hippo_gpu.cli import main

main()
