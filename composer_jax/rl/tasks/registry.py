"""The registry of RL task families (`composer_jax.rl.tasks` re-exports it and imports the
built-in families, which register themselves here). Importing it imports no JAX."""
from __future__ import annotations

from composer_jax.agent.tasks import TaskFamily
from composer_jax.config.rl import register_task_config, task_config_class
from composer_jax.errors import ConfigError

_FAMILIES: dict[str, type[TaskFamily]] = {}


def register(family: type[TaskFamily]) -> type[TaskFamily]:
    """Registers a task family class under `family.name` (usable as a class decorator)."""
    name = getattr(family, "name", "")
    if not name:
        raise ConfigError(f"task family {family!r} has no `name`")
    if _FAMILIES.get(name, family) is not family:
        raise ConfigError(f"two task families are registered as {name!r}: "
                          f"{_FAMILIES[name].__module__} and {family.__module__}")
    register_task_config(name, family.config_cls)
    _FAMILIES[name] = family
    return family


def get(name: str) -> type[TaskFamily]:
    """The family registered as `name` (module docstring)."""
    task_config_class(name)          # imports a plug-in module; unknown names list the registered
    if name not in _FAMILIES:
        raise ConfigError(f"rl.task={name!r} has a config section but no registered family; "
                          f"register its class with composer_jax.rl.tasks.register")
    return _FAMILIES[name]


def names() -> list[str]:
    return sorted(_FAMILIES)


def family_of(cfg) -> TaskFamily:
    """The task family of a Config (`cfg.rl.task.family`), built for it."""
    return get(cfg.rl.task.family)(cfg)

