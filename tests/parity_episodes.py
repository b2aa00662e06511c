"""A two-turn episode environment for the data-parallel tests (no sandbox): the model answers, the
"user" says "Again.", the model answers once more; reward 1 when the two answers together have an even
number of characters (a random model's groups disagree). :func:`install` makes rows with ``agent_ref``
``parity_episode`` episode rows in this process (a test's job process; no entry point is installed)."""

from __future__ import annotations

from typing import Any

from validators.episodes import Episode, Grade


class ParityEpisodes:
    def reset(self, row: dict[str, Any]) -> Episode:
        return Episode(row, [dict(m) for m in row["responses_create_params"]["input"]])

    def step(self, ep: Episode, response: str) -> list[dict[str, Any]]:
        ep.messages.append({"role": "assistant", "content": response})
        ep.steps += 1
        if ep.steps == 2:
            ep.end("finished")
            return []
        turn = [{"role": "user", "content": "Again."}]
        ep.messages += turn
        return turn

    def grade(self, ep: Episode) -> Grade:
        chars = sum(len(m["content"]) for m in ep.messages if m["role"] == "assistant")
        return Grade(float(chars % 2 == 0), chars % 2 == 0, f"{chars} characters")

    def close(self, ep: Episode) -> None:
        pass


def install() -> None:
    from stages import episodes

    builtin_env, builtin_is = episodes.episode_environment, episodes.is_episodic
    episodes.episode_environment = lambda ref, **kw: ParityEpisodes() if ref == "parity_episode" \
        else builtin_env(ref, **kw)
    episodes.is_episodic = lambda ref: ref == "parity_episode" or builtin_is(ref)
