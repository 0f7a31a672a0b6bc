"""The decoding loop and what it runs on above the engines: the loop and its rounds, the torch generator and session,
the plugins held to their contracts, accounting and traces, judging and calibration, and a run's config, model
loading, prompts and results."""
