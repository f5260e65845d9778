"""The registry of RL task families: `rl.task=NAME` runs the family registered as NAME.

    register(Family)        -> Family    (a class following `composer_jax.agent.tasks`; its
                                          config section class is registered with it)
    get(name)               -> Family    (a name with a dot is a module path, imported first:
                                          a plug-in family registers itself on import)
    names()                 -> sorted registered names

Built-in families register themselves the same way on import of this package: `lookup`
(`rl.tasks.lookup`, the default: multi-turn read_file/finish episodes with held-out prompt keys),
`parity` (`rl.tasks.parity`, the known-optimum single-turn family) and `coding`
(`rl.tasks.coding`, sandboxed coding episodes of the env task pool). Importing this package imports no JAX.
"""
from composer_jax.rl.tasks.registry import family_of, get, names, register
from composer_jax.rl.tasks import coding, lookup, parity  # noqa: F401  (the built-ins register)

__all__ = ["family_of", "get", "names", "register"]
