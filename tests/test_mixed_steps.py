"""Mixed steps (`EngineConfig.mixed_steps`, serve's single engine): prompts prefilled inside the decode steps,
the same greedy answers in fewer steps, and a newcomer's prompt still alone in its step."""

from __future__ import annotations

from minikv.bench.benchmark import bench_workload
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.request import Request

CLIENTS = 16


def closed_loop(tiny, mixed: bool, tenants: int = 1) -> tuple[dict[int, tuple[int, str]], list[str], Engine]:
    """48 of the benchmark's requests from CLIENTS closed-loop clients: each answer, each step's phase."""
    engine = Engine(*tiny, EngineConfig(num_pages=256, chunked_prefill=True, max_prefill_tokens=128,
                                        mixed_steps=mixed))
    schedule, phases = engine.scheduler.schedule, []

    def counted():
        batch = schedule()
        phases.append(batch.phase if batch else "idle")
        return batch

    engine.scheduler.schedule = counted
    pending, live, answers = list(enumerate(bench_workload(48, 3))), {}, {}
    while pending or live:
        while pending and len(live) < CLIENTS:
            i, r = pending.pop(0)
            live[engine.submit(Request(r.prompt, f"t{i % tenants}", r.max_tokens))] = i
        for response in engine.step():
            answers[live.pop(response.request_id)] = (response.status, response.text)
    engine.check_integrity()
    return answers, phases, engine


def test_mixed_steps_give_the_same_answers_in_fewer_steps(tiny):
    """Every request gets the same greedy text; most steps decode and prefill at once, and there are fewer."""
    plain, plain_phases, _ = closed_loop(tiny, mixed=False)
    mixed, mixed_phases, _ = closed_loop(tiny, mixed=True)
    assert mixed == plain and {status for status, _ in mixed.values()} == {200}
    assert "mixed" not in plain_phases and mixed_phases.count("mixed") > len(mixed_phases) // 3
    assert len(mixed_phases) < 0.8 * len(plain_phases)


def test_a_newcomers_prompt_still_runs_alone(tiny):
    """A tenant with nothing running gets a step of its own prompt, as without mixed steps (the fairness rule):
    with several tenants some steps are plain prefills, and each holds newcomers' requests only."""
    _, phases, _ = closed_loop(tiny, mixed=True, tenants=4)
    assert "prefill" in phases and "mixed" in phases
