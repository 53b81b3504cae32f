"""`npc_arena`: fine-tune one model to play many game NPCs, by RLAIF with retrieved world lore.

- `env`, `config`: `NPCArena` and its settings (`--env.*`; the judge under `--judge.*`);
- `characters`: character sheets (YAML) and their validation;
- `retrieval`, `lore`: BM25 or embeddings over lore documents and a tailed game-events file;
- `prompts`, `scoring`: what policy and judge read, and how verdicts become scores;
- `lines`: player lines (shipped, a JSONL file, or a hub dataset); `demo`: an offline responder.

Shipped data lives in `atropos/environments/data/npc_arena/`; see docs/npc_arena.md.
"""

from __future__ import annotations

from atropos.environments.common.retrieval import (
    BM25,
    EmbeddingRetriever,
    LoreDoc,
    RetrieverUnavailable,
    make_retriever,
)
from atropos.environments.npc_arena.characters import (
    CharacterError,
    CharacterSheet,
    load_character,
    load_characters,
)
from atropos.environments.npc_arena.config import NPCArenaConfig
from atropos.environments.npc_arena.demo import demo_responder
from atropos.environments.npc_arena.env import NPCArena
from atropos.environments.npc_arena.lore import EventFeed, LoreIndex, load_lore

__all__ = [
    # the environment
    "NPCArena",
    "NPCArenaConfig",
    "demo_responder",
    # characters
    "CharacterError",
    "CharacterSheet",
    "load_character",
    "load_characters",
    # lore and retrieval
    "BM25",
    "EmbeddingRetriever",
    "EventFeed",
    "LoreDoc",
    "LoreIndex",
    "RetrieverUnavailable",
    "load_lore",
    "make_retriever",
]
