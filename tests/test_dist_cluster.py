"""The front door across processes: a client cancel while a long prompt's KV is really in flight.

Carol's 38-page prompt goes out as one batch on a slow link (`link_s_per_page`, ours), so her
write lands about 0.6 s after prefill posts it. The client cancels her as soon as the front door
learns her KV is posted; once her 499 is back, Dave (another tenant) asks for a long answer and
gets the decode pages she freed. Without deferred_release her late write lands in Dave's pages
while he decodes over them; with it, her pages wait for the write and Dave's stay his.
"""

from __future__ import annotations

import multiprocessing
import random
from http import HTTPStatus

import pytest

from minikv.disagg.cluster import ClusterConfig
from minikv.disagg.dist.cluster import DistCluster, WorkerStartError
from minikv.disagg.switches import SafetySwitches
from minikv.engine.request import Request
from minikv.attacks.workload import document_sentence

CONFIG = ClusterConfig(prefill_pages=64, event_log=False)  # a 1,024-token window both pools hold
LINK_S_PER_PAGE = 0.015  # Carol's 38 pages: about 0.57 s on the link; Dave's 2: 0.03 s
CAROL_CHARS = 600
DAVE_PROMPT, DAVE_MAX_TOKENS = "dave: la la la la la la la la la la", 960  # 35 + 960 tokens: about a second of decoding
STEP_LIMIT = 20_000  # front-door steps (each waits at most 10 ms for news): a hang fails, never blocks


def late_write_through_the_front_door(tokenizer, deferred_release: bool) -> dict:
    """Carol cancelled mid-transfer, then Dave on her freed pages; what each got and what the decode worker saw."""
    # the pools shared (no cache_partition): Carol's 600 tokens are past a quota of half the prefill pool
    off = ["transfer_batch_cap", "cache_partition"] + ([] if deferred_release else ["deferred_release"])
    switches = SafetySwitches.preset("safe").with_switches(disable=off)
    cluster = DistCluster(tokenizer, CONFIG, switches, link_s_per_page=LINK_S_PER_PAGE)
    try:
        head = "carol: save key sk-live-7Hq2Zp9Xw4. "
        body = document_sentence(random.Random(0), CAROL_CHARS)[: CAROL_CHARS - len(head) - 2].rstrip() + "."
        carol = cluster.submit(Request(head + body + "\n", "carol", 32))
        for _ in range(STEP_LIMIT):
            if cluster.kv_in_flight(carol):
                break
            cluster.step()
        assert cluster.kv_in_flight(carol), "Carol's KV was never posted"
        assert cluster.cancel(carol)
        carol_answer = []
        for _ in range(STEP_LIMIT):
            carol_answer += cluster.step()
            if carol_answer:
                break
        dave = cluster.submit(Request(DAVE_PROMPT, "dave", DAVE_MAX_TOKENS))
        [dave_answer] = cluster.run(max_steps=STEP_LIMIT)
        for _ in range(STEP_LIMIT):  # until the decode worker has let go of every page
            if not cluster.leaked_pages() and cluster.reports[1]["late_writes"]:
                break
            cluster.step()
        return {"carol": carol_answer[0], "carol_id": carol, "dave": dave_answer, "dave_id": dave,
                "reads": cluster.cross_tenant_reads, "late": cluster.reports[1]["late_writes"], "held": cluster.leaked_pages()}
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def without_deferred_release(tiny):
    return late_write_through_the_front_door(tiny[1], deferred_release=False)


@pytest.fixture(scope="module")
def with_deferred_release(tiny):
    return late_write_through_the_front_door(tiny[1], deferred_release=True)


def test_cancel_mid_transfer_answers_499(without_deferred_release, with_deferred_release):
    """The cancelled request is answered 499 (client closed) and the next one 200, either way."""
    for run in (without_deferred_release, with_deferred_release):
        assert run["carol"].status == 499 and run["dave"].status == HTTPStatus.OK


def test_late_write_lands_in_the_next_tenants_pages_without_deferred_release(without_deferred_release):
    """Carol's write lands in pages Dave holds, and the decode audit sees Dave read Carol's KV."""
    run = without_deferred_release
    assert [w["holders"] for w in run["late"]] == [[run["dave_id"]]]
    assert run["reads"] > 0


def test_deferred_release_keeps_the_late_write_in_the_cancelled_requests_pages(with_deferred_release):
    """With deferred_release the write lands in pages Carol still holds; Dave reads only his own KV."""
    run = with_deferred_release
    assert [w["holders"] for w in run["late"]] == [[run["carol_id"]]]
    assert run["reads"] == 0 and run["held"] == 0


def test_a_worker_that_cannot_start_is_a_clear_error(tiny, tmp_path):
    """A model directory the workers cannot load: WorkerStartError naming why, and no worker left running."""
    with pytest.raises(WorkerStartError, match="worker failed to start") as refused:
        DistCluster(tiny[1], CONFIG, SafetySwitches.preset("safe"), model_dir=str(tmp_path / "missing"))
    assert "missing" in str(refused.value)
    assert not multiprocessing.active_children()


def test_startup_check_refuses_the_mismatched_pair_before_any_worker_starts(tiny):
    """startup_check closes the over-length path across processes as in one: the incident's pools are refused at once."""
    from minikv.disagg.cluster import StartupRefused

    with pytest.raises(StartupRefused, match="prefill"):
        DistCluster(tiny[1], ClusterConfig(event_log=False), SafetySwitches.preset("safe"))
    assert not multiprocessing.active_children()
