"""`DeepResearchConfig`: `deep_research`'s settings (`--env.*`; the judge under `--judge.*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeConfig
from atropos.envs.limits import ToolLimitsConfig

__all__ = ["DeepResearchConfig"]


class DeepResearchConfig(BaseEnvConfig, ToolLimitsConfig):
    """`deep_research`'s settings: data, tools, budgets, reward."""

    # ----- data
    corpus: str | None = Field(
        default=None,
        description="documents to search: a JSONL file (id, title, text) or a folder of .txt/.md"
        " files (unset: the shipped corpus, or the hub dataset's paragraphs)",
    )
    questions: str | None = Field(
        default=None,
        description="questions: a JSONL file (question, answers, supporting) or a folder with"
        " train.jsonl and test.jsonl (unset: the shipped questions)",
    )
    test_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="share of a single questions file held out"
    )
    dataset_name: str | None = Field(
        default=None,
        description="a HotpotQA-style hub dataset, e.g. hotpotqa/hotpot_qa: its questions, and"
        " its context paragraphs as the corpus",
    )
    dataset_config: str | None = Field(default="distractor", description="the hub config")
    hub_limit: int = Field(
        default=2000, ge=0, description="hub rows read per split (0: all of them)"
    )
    # ----- where search looks
    backend: Literal["local", "web"] = Field(
        default="local", description="search the local corpus, or the web through an API"
    )
    web_api: Literal["tavily", "brave"] = Field(
        default="tavily", description="the web search API's request and answer shape"
    )
    web_url: str | None = Field(default=None, description="the search endpoint (unset: the API's)")
    web_key_env: str = Field(
        default="TAVILY_API_KEY", description="the environment variable holding the API key"
    )
    web_timeout: float = Field(default=30.0, gt=0, description="seconds one search may take")
    # ----- tools
    top_k: int = Field(default=5, ge=1, le=50, description="results per search")
    snippet_chars: int = Field(default=240, ge=20, description="characters per result snippet")
    page_chars: int = Field(default=2000, ge=100, description="characters per opened page")
    max_tool_result_chars: int = Field(
        default=6000, ge=100, description="a tool result is cut to this many characters"
    )
    max_calls_per_turn: int = Field(default=4, ge=1, description="tool calls run per reply")
    tool_role: Literal["tool", "user"] = Field(
        default="tool",
        description="the role of tool results: tool (one message per call) or user (one"
        " message of <tool_response> blocks, for templates without a tool role)",
    )
    native_tools: bool = Field(
        default=False,
        description="give the tools to the chat template (`tools=`) instead of listing them in"
        " the system prompt",
    )
    # ----- budgets
    max_turns: int = Field(default=8, ge=1, description="replies per episode at most")
    max_reply_tokens: int = Field(default=512, ge=1, description="token limit of one reply")
    max_episode_tokens: int = Field(
        default=3072, ge=1, description="tokens the policy may generate in one episode, in all"
    )
    # ----- reward
    answer_metric: Literal["f1", "em", "judge"] = Field(
        default="f1", description="how the answer is scored: token F1, exact match or the judge"
    )
    citation_weight: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="w in reward = answer * ((1 - w) + w * citation score)",
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    # ----- sampling
    temperature: float = Field(default=1.0, ge=0, description="sampling temperature (training)")
    eval_limit: int = Field(
        default=0, ge=0, description="held-out questions per evaluation (0: all of them)"
    )

    @model_validator(mode="after")
    def _one_corpus(self) -> DeepResearchConfig:
        if self.dataset_name and (self.corpus or self.questions):
            raise ValueError(
                "--env.dataset_name brings its own questions and corpus: drop --env.corpus and"
                " --env.questions, or drop --env.dataset_name"
            )
        return self
