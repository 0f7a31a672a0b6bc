"""``rodeco_rewards.experiments.llm_judge_pairs``'s command line (``--help``: what it does and its arguments)."""

from rodeco_rewards.experiments.llm_judge_pairs import main

if __name__ == "__main__":
    main()
