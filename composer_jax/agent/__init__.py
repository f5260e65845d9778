"""What an agent is, below both `rl/` and `eval/`: the episode loop, the token-level agent, the
rollout record, self-summarization and the RL task families. Importing this package (or any of
its modules) never imports JAX, so rollout workers stay light; the engine is reached through a
client (`agent.policy_client`).

    agent.episode        THE episode loop (`run_loop`) and the text-level `run_episode`
    agent.token_agent    `TokenAgent`: episodes on an engine session, recorded as a `Rollout`
    agent.rollout        `Rollout` / `Segment`: exactly what the policy saw and sampled
    agent.summarize      self-summarization mechanics
    agent.policy_client  `PolicyClient`, `EngineClient`: an engine behind a policy server
    agent.tasks          the protocol of an RL task family (`rl.task=NAME`; the registry is
                         `composer_jax.rl.tasks`)

Import submodules directly (`from composer_jax.agent.token_agent import TokenAgent`).
"""
