"""Joining a Ray cluster from the driver (the CLI's `--ray [ADDRESS|local]`)."""

from __future__ import annotations

from typing import Any


def import_ray() -> Any:
    """The `ray` module, or ImportError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401  (retrieve needs Ray Data: the `ray[data]` extra)
    except ImportError as e:
        raise ImportError("the Ray back end needs Ray Data: pip install 'hippo-gpu[ray]'") from e
    return ray


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """Start (address "local") or join (address "auto" or "ray://host:port" or "host:port") a
    Ray cluster unless this process is already connected. Returns whether this call connected,
    i.e. whether the caller should `ray.shutdown()` when done.

    A local instance ("local": always a new one, even where a cluster already runs on this
    machine) gets `num_cpus` (default: all cores) and no dashboard.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    return True
