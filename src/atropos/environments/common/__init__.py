"""Helpers that several environments share; each environment's own helpers live in its package.

- `data_loading`: the shipped fixtures (`data_path`) and datasets read by name, from the hub or
  a local JSONL path (`load_hub`, `load_train_test`, `split_rows`).
- `held_out`: `HeldOutEnv`, an env whose items are its fixture or a hub dataset with a share
  held out (`--env.dataset_name`, `--env.test_fraction`).
- `tool_calls`: parsing `<tool_call>` blocks and scoring calls against the expected ones.
- `choices`: the answers a completion states to a multiple-choice question (`extract_answers`).
- `ifeval`: the IFEval instruction checks (`instruction_following`, `eval_ifeval`).
- `curriculum`: a level moved by the rolling success rate (`letter_counting`, `infinimath`).
- `completions`: the answer part after the think block, `\\boxed{}` contents, the conversation
  asking for a think block (the format environments).
- `selection`: settings that name some of a fixed set, with "did you mean".
- `expressions`: exact values of arithmetic expressions without `eval` (`agent_tools`'s and
  `mt_grpo`'s calculators, `infinimath`'s problems).
- `demo`: the parts of the offline demo responders (shipped rows, right and wrong in turn).
- `multiturn`: what the token-exact multi-turn environments share: the token-server check,
  the room left for a reply, one rollout's next turn on its own session, the group of their
  sequences (`deep_research`, `mt_grpo`, `mcp_tools`, `tool_use_multiturn`, the games and
  `textworld`).
- `retrieval`: BM25 (pure Python) and sentence-embedding retrievers over short documents
  (`npc_arena`'s lore, `deep_research`'s collections).
- `turn_credit`: MT-GRPO's turn-level advantages and their mapping onto each turn's tokens
  (`mt_grpo`).
- `vision`: pictures as base64 PNG, the text-only copy the trainer tokenizes, and `ImageEnv`,
  sampling with the picture and grouping it (`visual_counting`, the multimodal family).

Importing this package imports none of them.
"""
