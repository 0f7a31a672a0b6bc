"""Pools and their replay: each prompt's candidates decoded once with the live model and stored (``pool``,
``recording``), and the real loop run over them instead of a model (``pool_session``, ``pool_rewards``, ``replay``,
``replay_open``)."""
