"""What the IRCoT options of eval, qa, retrieve and serve share: the reasoner they build from
--llm, --dataset, --ircot-prompt and --ircot-passages, and its counters as a table row."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hippo_gpu.cli.common import fail

if TYPE_CHECKING:
    from hippo_gpu.llm.backends import Backend
    from hippo_gpu.llm.cache import LLMCache
    from hippo_gpu.llm.ircot import IRCoTReasoner, ReasonerSpec

MAX_STEPS_HELP = "IRCoT steps per question: its own retrieval, then up to S-1 thoughts"
PROMPT_HELP = ("IRCoT prompt file: .json {\"system\", \"demos\": [[user, assistant], ...]} or "
               "a text file holding the system prompt (default: the --dataset's prompt)")
DATASET_HELP = ("dataset whose IRCoT prompt to use: musique, 2wikimultihopqa, hotpotqa (a name "
                "starting so), anything else: generic")
PASSAGES_HELP = "passages shown to the LLM per thought (default: all top_k, as upstream)"


def make_reasoner(llm: str | Backend, cache: LLMCache | Path | None, *, dataset: str | None,
                  prompt_file: Path | None, max_passages: int | None) -> IRCoTReasoner:
    """The IRCoT reasoner of a command (it owns a backend built here from a spec string)."""
    from hippo_gpu.llm.backends import BackendSpecError
    from hippo_gpu.llm.ircot import IRCoTReasoner
    from hippo_gpu.llm.ircot_prompts import IRCoTPromptError, read_ircot_prompt

    try:
        prompt = read_ircot_prompt(prompt_file) if prompt_file is not None else None
        return IRCoTReasoner(llm, cache, prompt=prompt, dataset=dataset,
                             max_passages=max_passages)
    except (IRCoTPromptError, BackendSpecError, ValueError) as e:
        fail(str(e))


def reasoner_spec(llm: str, *, dataset: str | None, prompt_file: Path | None,
                  max_passages: int | None) -> ReasonerSpec:
    """What Ray Serve replicas open as their reasoner (no cache: see ray_serve), checked here
    so a bad spec or prompt file fails the command, not every replica's start."""
    from hippo_gpu.llm.backends import BackendSpecError, parse_spec
    from hippo_gpu.llm.ircot import ReasonerSpec
    from hippo_gpu.llm.ircot_prompts import IRCoTPromptError, read_ircot_prompt

    try:
        parse_spec(llm)
        prompt = read_ircot_prompt(prompt_file) if prompt_file is not None else None
    except (IRCoTPromptError, BackendSpecError, ValueError) as e:
        fail(str(e))
    return ReasonerSpec(llm, None, prompt=prompt, dataset=dataset, max_passages=max_passages)


def check_max_steps(max_steps: int) -> int:
    if max_steps < 1:
        raise typer.BadParameter(f"--max-steps must be >= 1, got {max_steps}")
    return max_steps


def reasoner_counts(reasoner: IRCoTReasoner) -> dict[str, Any]:
    """LLM calls, cache hits and failures by reason, as the commands report them."""
    return {"llm_calls": reasoner.calls, "cached": reasoner.cached,
            "failures": dict(reasoner.failures), "prompt": reasoner.prompt.key}
