"""Page maps, replay and the step-through widget, checked on their state rather than their pixels."""

from __future__ import annotations

import base64
import colorsys
import io
from unittest import mock

import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from minikv.engine.events import Event as E
from minikv.engine.events import EventLog
from minikv.engine.request import Response, Usage
from minikv.viz import (PageStatus, ReplayWidget, describe, find_event, frame_indices, page_map, page_styles,
                        queues_at, replay, stage_spans, tenant_colours, timeline, ttft_plot)
from minikv.viz.demo import MINIATURE_INCIDENT, MINIATURE_POOLS
from minikv.viz.queues import wire_spans
from minikv.viz.page_map import _legend_handles, grid_shape
from minikv.viz.palette import CROSS_READ, NEVER_WRITTEN, TENANT_COLOURS, faded
from minikv.viz.picture import DPI
from minikv.attacks.workload import TENANTS

POOLS, INCIDENT = MINIATURE_POOLS, MINIATURE_INCIDENT  # the incident by hand; events indexed in demo.py
COLOURS = tenant_colours(["alice", "bob"])


# -- replay: the pool's state from the log alone ----------------------------------------------
def test_boot_state_has_every_page_free_and_never_written():
    """Before the first event no page has an owner or a writer."""
    decode = replay(INCIDENT, POOLS, upto=-1)["decode"]
    assert decode.pages(PageStatus.NEVER_WRITTEN) == list(range(8))


def test_written_pages_of_their_owner_are_owned():
    """A page allocated to a request and written by it is OWNED by that tenant."""
    decode = replay(INCIDENT, POOLS, upto=8)["decode"]
    assert decode.pages(PageStatus.OWNED) == [0, 1]
    assert decode.owner_tenant[0] == "alice" and decode.writer[0] == "a1"


def test_allocated_but_unwritten_page_is_reserved():
    """Allocation alone gives ownership; with no data of the owner in it the page is RESERVED."""
    decode = replay(INCIDENT, POOLS, upto=8)["decode"]
    assert decode.status(2) is PageStatus.RESERVED and decode.writer[2] is None


def test_freed_pages_keep_their_last_writer():
    """free gives the page back but the data stays: the page is STALE, its writer still alice."""
    decode = replay(INCIDENT, POOLS, upto=15)["decode"]
    assert decode.pages(PageStatus.STALE) == [0, 1, 2]
    assert decode.owner[0] is None and decode.writer_tenant[0] == "alice"


def test_reallocated_stale_pages_are_reserved_over_the_old_data():
    """bob's fresh reservation sits on alice's data: owner bob, writer still alice."""
    decode = replay(INCIDENT, POOLS, upto=22)["decode"]
    assert [decode.status(p) for p in (0, 1, 2, 3)] == [PageStatus.RESERVED] * 4
    assert decode.owner_tenant[0] == "bob" and decode.writer_tenant[0] == "alice"
    assert decode.writer[3] is None


def test_block_table_follows_allocation_order_and_goes_on_free():
    """A request's block table is its allocated pages in order; freeing removes it."""
    assert replay(INCIDENT, POOLS, upto=22)["decode"].block_tables["b1"] == (2, 1, 0, 3)
    assert "b1" not in replay(INCIDENT, POOLS, upto=29)["decode"].block_tables


def test_preempt_returns_pages_like_free():
    """A preempted request's pages go back to the free list with their data."""
    log = [E(0, "node", "allocate", "r", "carol", (0, 1)), E(0, "node", "write", "r", "carol", (0, 1)),
           E(1, "node", "preempt", "r", "carol", (0, 1), "pool full")]
    state = replay(log, 4)["node"]
    assert state.pages(PageStatus.STALE) == [0, 1] and state.block_tables == {}


def test_cross_reads_are_marked_in_their_step_and_remembered():
    """cross_read pages are 'now' during their step only, and 'ever' from then on."""
    during, after = replay(INCIDENT, POOLS, upto=28)["decode"], replay(INCIDENT, POOLS, upto=29)["decode"]
    assert during.cross_read_now == {0, 1}
    assert after.cross_read_now == set() and after.cross_read_ever == {0, 1}


def test_written_now_covers_only_the_current_step():
    """Pages written earlier in the same step are highlighted; an older step's are not."""
    assert replay(INCIDENT, POOLS, upto=24)["decode"].written_now == {2}
    assert replay(INCIDENT, POOLS, upto=27)["decode"].written_now == set()


def test_each_node_has_its_own_pool():
    """Page 0 of prefill and page 0 of decode are different pages."""
    states = replay(INCIDENT, POOLS, upto=20)
    assert states["prefill"].owner[0] == "b1" and states["decode"].owner[0] is None


def test_one_size_applies_to_every_node_named():
    """An int num_pages gives every node in the log that many pages."""
    assert {n: s.num_pages for n, s in replay(INCIDENT, 9).items()} == {"prefill": 9, "decode": 9}


def test_replay_skips_nodes_without_a_pool():
    """Events of nodes missing from num_pages (the front door, the fabric) change no pool."""
    assert set(replay(INCIDENT, {"prefill": 4})) == {"prefill"}


def test_replay_refuses_a_page_outside_the_pool():
    """An event naming page 8 of an 8-page pool is an error that names the page."""
    with pytest.raises(ValueError, match="page 8"):
        replay([E(0, "node", "allocate", "r", "t", (8,))], 8)


def test_replay_refuses_an_index_past_the_log():
    """upto beyond the last event is an IndexError, not a silent clamp."""
    with pytest.raises(IndexError):
        replay(INCIDENT, POOLS, upto=len(INCIDENT))


def test_replay_accepts_an_event_log():
    """An EventLog and its list of events replay to the same state."""
    log = EventLog(events=list(INCIDENT))
    assert replay(log, POOLS) == replay(INCIDENT, POOLS)


def test_replay_matches_the_real_engine_pool_at_every_step(tiny):
    """Owners and block tables rebuilt from the log equal the engine's own after every step."""
    from minikv.engine.config import EngineConfig
    from minikv.engine.engine import Engine
    from minikv.engine.request import Request
    from minikv.attacks.workload import Note, note_prompt

    model, tok = tiny
    engine = Engine(model, tok, EngineConfig(num_pages=6, page_size=8))
    for i, tenant in enumerate(["alice", "bob", "carol"]):
        engine.submit(Request(note_prompt(tenant, Note("pin", f"{1000 + i}")), tenant, max_tokens=8))
    while engine.has_work():
        engine.step()
        state = replay(engine.log, engine.pool.num_pages)["single"]
        assert state.owner == tuple((h or [None])[0] for h in engine.pool.holders)  # each page's first holder
        assert dict(state.block_tables) == {s.request_id: tuple(s.block_table) for s in engine.scheduler.running}
    assert engine.log.of_kind("preempt"), "the pool is small enough that someone is preempted"
    assert replay(engine.log, 6)["single"].pages(PageStatus.STALE)


# -- frames: which events a step-through shows --------------------------------------------------
def test_changes_skip_reads_and_rewrites_of_own_pages():
    """'changes' drops reads and writes into pages the request already wrote, keeps the rest."""
    frames = frame_indices(INCIDENT, "changes")
    assert 11 not in frames and 12 not in frames and 27 not in frames
    assert {13, 24, 28} <= set(frames)


def test_all_frames_are_every_event():
    """'all' shows every event."""
    assert frame_indices(INCIDENT, "all") == list(range(len(INCIDENT)))


def test_step_frames_end_each_step():
    """'steps' shows the last event of each engine step."""
    assert frame_indices(INCIDENT, "steps") == [4, 9, 12, 13, 15, 20, 25, 28, 30]


def test_unknown_frame_mode_is_an_error():
    """A misspelt mode fails loudly."""
    with pytest.raises(ValueError, match="mode"):
        frame_indices(INCIDENT, "every")


def test_find_event_locates_the_nth_match():
    """find_event gives the index of the first (or nth, or last) matching event."""
    assert find_event(INCIDENT, "cross_read") == 28
    assert find_event(INCIDENT, "allocate", node="decode", nth=-1) == 22
    with pytest.raises(LookupError):
        find_event(INCIDENT, "cancel")


# -- queues and captions -----------------------------------------------------------------------
def test_queues_list_every_stage_in_pipeline_order():
    """Every stage the log names is a queue, prefill's before decode's, empty ones too."""
    assert list(queues_at(INCIDENT, 0)) == ["prefill.bootstrap", "prefill.waiting", "prefill.inflight",
                                            "decode.prealloc", "decode.transfer", "decode.running"]


def test_queue_holds_the_request_in_its_latest_stage():
    """After decode.prealloc bob sits in that queue and nowhere else."""
    queues = queues_at(INCIDENT, 22)
    assert queues["decode.prealloc"] == ["bob/b1"]
    assert sum(len(q) for q in queues.values()) == 1


def test_a_rejected_request_that_moves_on_is_back_in_the_queues():
    """reject takes bob out; the next stage event (the bug) puts him back."""
    assert all("bob/b1" not in q for q in queues_at(INCIDENT, 17).values())
    assert queues_at(INCIDENT, 18)["prefill.waiting"] == ["bob/b1"]


def test_single_node_queues_are_waiting_then_running():
    """Without stage events a request waits from submit, runs from allocate, leaves at finish."""
    log = [E(0, "node", "submit", "r", "t"), E(1, "node", "allocate", "r", "t", (0,)),
           E(3, "node", "free", "r", "t", (0,)), E(3, "node", "finish", "r", "t")]
    assert [queues_at(log, i) for i in (0, 1, 3)] == [
        {"node.waiting": ["t/r"], "node.running": []},
        {"node.waiting": [], "node.running": ["t/r"]},
        {"node.waiting": [], "node.running": []},
    ]


def test_stage_spans_cover_the_steps_between_moves():
    """bob's decode.running span runs from step 7 to his finish at step 8."""
    spans = [s for s in stage_spans(INCIDENT) if s.request_id == "b1"]
    assert [(s.stage, s.start, s.end) for s in spans][-1] == ("decode.running", 7, 8)
    assert spans[0].stage == "prefill.bootstrap" and spans[0].end == 5


def test_allocate_caption_names_node_pages_and_request():
    """The caption of an allocation reads like the incident report."""
    assert describe(INCIDENT[22]) == "decode reserved 4 pages for bob/b1"


def test_cross_read_caption_names_reader_and_victim():
    """A cross-tenant read says who read whose pages."""
    assert describe(INCIDENT[28]) == "CROSS-TENANT READ on decode: bob/b1 read 2 pages written by alice/a1"


def test_read_of_never_written_memory_is_captioned_as_such():
    """A read of pages nobody wrote names no victim."""
    event = E(7, "decode", "cross_read", "b1", "bob", (3,), "victim=never-written")
    assert describe(event) == "UNWRITTEN READ on decode: bob/b1 read 1 page nobody had written"


# -- the page map --------------------------------------------------------------------------------
def test_page_styles_colour_by_tenant_fade_stale_and_blank_the_unwritten():
    """Owned: the tenant's colour; stale: faded; never written: blank."""
    styles = page_styles(replay(INCIDENT, POOLS, upto=15)["decode"], COLOURS)
    assert styles[0].status is PageStatus.STALE and styles[0].fill == faded(COLOURS["alice"])
    assert styles[5].fill == NEVER_WRITTEN
    owned = page_styles(replay(INCIDENT, POOLS, upto=8)["decode"], COLOURS)[0]
    assert owned.fill == COLOURS["alice"] and owned.tenant == "alice"


def test_reserved_pages_show_owner_hatch_over_the_old_data():
    """bob's reservation over alice's page: alice's faded colour under bob's hatch."""
    style = page_styles(replay(INCIDENT, POOLS, upto=22)["decode"], COLOURS)[1]
    assert (style.tenant, style.data_tenant, style.hatch) == ("bob", "alice", COLOURS["bob"])
    assert style.fill == faded(COLOURS["alice"])


def test_page_styles_number_the_block_table_in_order():
    """The outlined request's pages carry their block-table indices 0, 1, 2, ..., as block_table[i] does."""
    styles = page_styles(replay(INCIDENT, POOLS, upto=22)["decode"], COLOURS, request="b1")
    assert [styles[p].order for p in (2, 1, 0, 3)] == [0, 1, 2, 3]
    assert styles[4].order is None


def test_page_styles_mark_cross_reads_now_or_ever():
    """cross_reads='ever' keeps the mark after the step; 'now' does not."""
    after = replay(INCIDENT, POOLS, upto=30)["decode"]
    assert [s.page for s in page_styles(after, COLOURS, cross_reads="ever") if s.cross_read] == [0, 1]
    assert not any(s.cross_read for s in page_styles(after, COLOURS))


@pytest.mark.parametrize("num_pages, shape", [(1, (1, 1)), (16, (2, 8)), (128, (8, 16)), (2000, (32, 64))])
def test_grid_stays_readable_from_one_to_two_thousand_pages(num_pages, shape):
    """The grid is about twice as wide as tall and never wider than 64 cells."""
    assert grid_shape(num_pages) == shape


def test_page_map_text_says_which_moment_it_shows():
    """The picture's text (what nbval compares) names the event and the page counts."""
    picture = page_map(INCIDENT, POOLS, at=22, request="b1", page_size=16)
    assert repr(picture) == ("Page map. After event 23 of 31 (step 6): decode reserved 4 pages for bob/b1. "
                             "prefill: 1 owned, 0 reserved, 1 stale, 2 never written; "
                             "decode: 0 owned, 4 reserved, 0 stale, 4 never written")


def cell_colours(picture, num_pages: int) -> list[tuple[int, int, int]]:
    """The PNG's pixel at the centre of each page's cell (of the first panel), as 0-255 RGB."""
    image = Image.open(io.BytesIO(picture.png())).convert("RGB")
    ax, (_, cols), scale = picture.figure.axes[0], grid_shape(num_pages), DPI / picture.figure.dpi
    centres = [ax.transData.transform((p % cols, p // cols)) for p in range(num_pages)]
    return [image.getpixel((int(x * scale), int(image.height - y * scale))) for x, y in centres]


def rgb255(colour: str) -> tuple[int, int, int]:
    return tuple(round(255 * c) for c in to_rgb(colour))


@pytest.mark.parametrize("at, fills", [
    (8, ["alice", "alice"] + [NEVER_WRITTEN] * 5),  # page 2 (reserved, hatched) left out
    (15, ["faded alice"] * 3 + [NEVER_WRITTEN] * 5),
])
def test_page_map_png_paints_each_cell_in_its_pages_colour(at, fills):
    """In the PNG each decode page's cell is its owner's colour, faded once freed, blank if unwritten."""
    want = {"alice": COLOURS["alice"], "faded alice": faded(COLOURS["alice"]), NEVER_WRITTEN: NEVER_WRITTEN}
    got = cell_colours(page_map(INCIDENT, POOLS, at=at, nodes=["decode"]), POOLS["decode"])
    pages = [p for p in range(8) if not (at == 8 and p == 2)]
    assert [got[p] for p in pages] == [rgb255(want[f]) for f in fills]


def test_page_map_draws_one_panel_per_node_asked_for():
    """nodes= picks the pools drawn."""
    assert len(page_map(INCIDENT, POOLS, nodes=["decode"]).figure.axes) == 1
    assert len(page_map(INCIDENT, POOLS).figure.axes) == 2


# -- the widget ---------------------------------------------------------------------------------
@pytest.fixture
def player():
    return ReplayWidget(INCIDENT, POOLS, page_size=16)


def test_widget_opens_on_the_last_frame(player):
    """By default the player shows the end of the log."""
    assert player.event_index == len(INCIDENT) - 1
    assert "bob/b1 finished on decode" in player.caption.value


def test_widget_opens_at_the_event_asked_for():
    """start= opens on the last frame at or before that event."""
    player = ReplayWidget(INCIDENT, POOLS, start=12)
    assert player.event_index == 10  # events 11 and 12 change nothing on the map


def test_setting_the_slider_replays_to_that_frame(player):
    """Moving the slider to bob's reservation shows bob owning alice's stale pages."""
    player.slider.value = player.frames.index(22)
    styles = player.styles()["decode"]
    assert [styles[p].tenant for p in (0, 1, 2, 3)] == ["bob"] * 4
    assert [styles[p].data_tenant for p in (0, 1, 2, 3)] == ["alice", "alice", "alice", None]
    assert player.caption.value.endswith("(step 6): decode reserved 4 pages for bob/b1</div>")


def test_frame_zero_is_boot(player):
    """The first frame is the empty pool before any event."""
    player.slider.value = 0
    assert player.event is None and "At boot" in player.caption.value
    assert all(s.status is PageStatus.NEVER_WRITTEN for s in player.styles()["decode"])


def test_next_and_previous_buttons_move_one_frame(player):
    """next ▶ and ◀ previous step the slider by one frame."""
    player.slider.value = 5
    player.next.click()
    assert player.slider.value == 6
    player.previous.click()
    player.previous.click()
    assert player.slider.value == 4


def test_buttons_stop_at_the_ends(player):
    """next on the last frame and previous on the first stay put."""
    player.next.click()
    assert player.slider.value == player.slider.max
    player.slider.value = 0
    player.previous.click()
    assert player.slider.value == 0


def test_play_and_slider_are_linked_in_the_browser(player):
    """A jslink ties Play to the slider, so they move together without the kernel too."""
    assert player.link.source == (player.play, "value") and player.link.target == (player.slider, "value")
    assert (player.play.max, player.play.value) == (player.slider.max, player.slider.value)


def test_the_image_is_redrawn_for_each_frame(player):
    """The page map image is a PNG and changes when the frame does."""
    last = bytes(player.image.value)
    player.slider.value = player.frames.index(22)
    assert bytes(player.image.value).startswith(b"\x89PNG") and bytes(player.image.value) != last


def test_cross_read_frame_is_captioned_as_an_alarm(player):
    """The cross-read frame marks alice's pages and turns the caption red."""
    player.slider.value = player.frames.index(28)
    assert [s.page for s in player.styles()["decode"] if s.cross_read] == [0, 1]
    assert "CROSS-TENANT READ" in player.caption.value and f"color:{CROSS_READ}" in player.caption.value


def test_widget_outlines_the_current_events_request(player):
    """With no request given, the block table outlined is the current event's request's."""
    player.slider.value = player.frames.index(22)
    assert player.outlined_request() == "b1"
    numbered = [s for s in player.styles()["decode"] if s.order is not None]
    assert [s.page for s in sorted(numbered, key=lambda s: s.order)] == [2, 1, 0, 3]


def test_widget_shows_the_queues(player):
    """The queue panel lists the stages with who is in each."""
    player.slider.value = player.frames.index(21)
    assert "decode.prealloc" in player.queue.value and "bob/b1" in player.queue.value
    assert player.queues()["decode.prealloc"] == ["bob/b1"]


def test_widget_text_is_stable(player):
    """The text nbval compares has no memory address and names the pools."""
    assert repr(player) == "ReplayWidget(31 events, 29 frames; prefill 4 pages, decode 8 pages)"
    assert player._repr_mimebundle_()["text/plain"] == repr(player)


def test_show_displays_one_output_whose_still_is_the_frame_on_show(player):
    """One output: the live widget, carrying a PNG of its frame for viewers that cannot draw it."""
    with mock.patch("minikv.viz.widget.display") as display:
        player.show()
    assert [call.args[0] for call in display.call_args_list] == [player]
    bundle = player._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]) == bytes(player.image.value)


def test_the_player_and_a_page_map_name_one_moment_alike(player):
    """A still (page_map at=i) and the player opened at event i both say "after event i+1 of n"."""
    opened = ReplayWidget(INCIDENT, POOLS, start=28)
    moment = repr(page_map(INCIDENT, POOLS, at=28)).removeprefix("Page map. ").split(". ")[0]
    assert moment == "After event 29 of 31 (step 7): CROSS-TENANT READ on decode: bob/b1 read 2 pages written by alice/a1"
    assert opened.caption_text() == f"Frame {opened.slider.value}/{len(opened.frames) - 1}. {moment}"


# -- timeline and time to first token ---------------------------------------------------------------
def test_timeline_draws_one_bar_per_stage_visit():
    """Each stretch a request spent in a stage for a step or more is one bar; the legend names the rest."""
    picture = timeline(INCIDENT, mark=["b1"])
    lasting = [s for s in stage_spans(INCIDENT) if s.end is None or s.end > s.start]
    assert len(picture.figure.axes[0].patches) == len(lasting) < len(stage_spans(INCIDENT))
    labels = [t.get_text() for t in picture.figure.axes[0].get_legend().get_texts()]
    assert labels[-1].startswith("under 1 step:") and "prefill.bootstrap" in labels[-1]
    assert repr(picture).startswith("Timeline of 2 requests over 9 steps through prefill.bootstrap")


def test_timeline_of_a_single_node_shows_waiting_and_running():
    """Without stage events the timeline falls back to submit -> allocate -> finish."""
    log = [E(0, "node", "submit", "r", "t"), E(1, "node", "allocate", "r", "t", (0,)),
           E(3, "node", "free", "r", "t", (0,)), E(3, "node", "finish", "r", "t")]
    assert "through node.waiting, node.running; 1 finished" in repr(timeline(log))


def test_ttft_plot_marks_the_chosen_request():
    """The marked request is drawn apart and named; unanswered requests are left out."""
    responses = [Response(f"r{n}", "alice", 200, usage=Usage(n, 4), ttft_s=n / 1000) for n in (20, 40, 80)]
    responses += [Response("leak", "bob", 200, usage=Usage(900, 4), ttft_s=0.004),
                  Response("no", "carol", 400, usage=Usage(2000, 0), error="too long")]
    picture = ttft_plot(responses, mark=["leak"])
    assert repr(picture) == ("TTFT against prompt length for 4 answered requests (1 without a first token not drawn); "
                             "marked: bob/leak")
    dots, star = (c.get_offsets().tolist() for c in picture.figure.axes[0].collections[:2])
    assert dots == [[20, 20.0], [40, 40.0], [80, 80.0]] and star == [[900, 4.0]]  # (prompt tokens, ms)


# -- the exercise checker -----------------------------------------------------------------------------
def _stale_pages_by_hand(events, num_pages):
    """A learner's correct answer: pages given back (free or preempt) that were written at some point."""
    owner, written = [None] * num_pages, set()
    for e in events:
        for p in e.pages:
            if e.kind == "allocate":
                owner[p] = e.request_id
            elif e.kind in ("free", "preempt"):
                owner[p] = None
            elif e.kind == "write":
                written.add(p)
    return [p for p in range(num_pages) if owner[p] is None and p in written]


def test_stale_page_checker_accepts_a_correct_answer(capsys):
    """A correct stale_pages passes and the checker says so in one line."""
    from minikv.exercises.nb02_page_pools import check_stale_pages

    check_stale_pages(_stale_pages_by_hand)
    assert capsys.readouterr().out == "correct on 7 event logs\n"


def test_stale_page_checker_rejects_all_free_pages():
    """Counting every free page as stale (forgetting never-written ones) fails with a hint."""
    from minikv.exercises.nb02_page_pools import check_stale_pages

    def every_free_page(events, num_pages):
        return [p for p in range(num_pages) if replay(events, num_pages)["node"].owner[p] is None]

    with pytest.raises(AssertionError, match="Giving back does not erase"):
        check_stale_pages(every_free_page)


def test_simulated_logs_have_stale_and_never_written_pages():
    """The checker's logs exercise both kinds of free page, so a sloppy answer cannot pass."""
    from minikv.exercises.nb02_page_pools import simulated_log

    states = [replay(simulated_log(seed), 12)["node"] for seed in range(6)]
    assert any(s.pages(PageStatus.STALE) for s in states)
    assert any(s.pages(PageStatus.NEVER_WRITTEN) for s in states)


# -- one look across the series -------------------------------------------------------------------
def test_a_workload_tenant_keeps_its_colour_whoever_else_is_drawn():
    """carol is the same colour in a picture of alice, bob and carol as in one of carol and dave."""
    assert tenant_colours(["alice", "bob", "carol"])["carol"] == tenant_colours(["carol", "dave"])["carol"]
    other = tenant_colours(["carol", "someone"])
    assert other["someone"] != other["carol"] and other["someone"] in TENANT_COLOURS


def test_the_first_five_tenants_lie_far_apart_in_hue():
    """bob and dave (and every other pair of alice..erin) are not two shades of one colour."""
    hues = {t: colorsys.rgb_to_hsv(*to_rgb(c))[0] for t, c in tenant_colours(TENANTS[:5]).items()}
    gaps = {(a, b): min(abs(hues[a] - hues[b]), 1 - abs(hues[a] - hues[b])) for a in hues for b in hues if a < b}
    assert min(gaps.values()) > 0.1, gaps


def test_legend_explains_the_ref_counts_it_draws():
    """A page two requests hold carries its ref count, and the legend says what the number means."""
    log = [E(0, "n", "allocate", "a1", "alice", (0,)), E(0, "n", "write", "a1", "alice", (0,)),
           E(1, "n", "cache_hit", "b1", "bob", (0,))]
    styles = page_styles(replay(log, 4)["n"], COLOURS)
    assert styles[0].ref_count == 2
    assert "n in the corner: ref count, requests sharing the page" in [h.get_label() for h in _legend_handles(styles, COLOURS, None)]
    assert not _legend_handles(styles, COLOURS, None, ref_counts_drawn=False)[-1].get_label().startswith("n in")


def test_legend_lists_only_what_the_picture_draws():
    """Before bob arrives, nothing is hatched or read across tenants, so the legend says neither."""
    styles = page_styles(replay(INCIDENT, POOLS, upto=15)["decode"], COLOURS)
    labels = [h.get_label() for h in _legend_handles(styles, COLOURS, None)]
    assert labels == ["alice's old data (freed, faded)", "free, never written"]


def test_stale_swatch_is_faded_in_the_writers_colour():
    """The swatch of alice's stale pages is filled exactly as her stale cells are."""
    styles = page_styles(replay(INCIDENT, POOLS, upto=28)["decode"], COLOURS, request="b1")
    handles = {h.get_label(): h for h in _legend_handles(styles, COLOURS, "bob/b1")}
    stale_fill = next(s.fill for s in styles if s.data_tenant == "alice" and s.status is not PageStatus.OWNED)
    assert faded(COLOURS["alice"]) == stale_fill
    assert handles["alice's old data (freed, faded)"].get_facecolor()[:3] == pytest.approx(to_rgb(stale_fill))
    assert "red: read across tenants (audit)" in handles and "reserved by bob, not yet written by it" in handles


def test_a_request_sits_in_a_prefill_and_a_decode_stage_at_once():
    """decode.transfer lasts until decode runs (step 5), overlapping prefill.inflight (steps 2-5)."""
    log = [E(0, "prefill", "stage", "r", "t", (), "prefill.bootstrap"), E(0, "decode", "stage", "r", "t", (), "decode.prealloc"),
           E(1, "prefill", "stage", "r", "t", (), "prefill.waiting"), E(1, "decode", "stage", "r", "t", (), "decode.transfer"),
           E(2, "prefill", "stage", "r", "t", (), "prefill.inflight"), E(5, "prefill", "free", "r", "t", (0,)),
           E(5, "decode", "stage", "r", "t", (), "decode.running"), E(8, "decode", "finish", "r", "t")]
    spans = {s.stage: (s.start, s.end) for s in stage_spans(log)}
    assert spans["prefill.inflight"] == (2, 5) and spans["decode.transfer"] == (1, 5)
    assert spans["decode.running"] == (5, 8)


def test_each_posted_kv_batch_is_a_span_until_it_lands():
    """Two batches posted at steps 1 and 3 land at 3 and 6; a third never lands."""
    log = [E(1, "fabric", "post", "r", "t", (0,)), E(3, "decode", "write", "r", "t", (0,), "KV transfer landed"),
           E(3, "fabric", "post", "r", "t", (1,)), E(6, "decode", "write", "r", "t", (1,), "KV transfer landed LATE"),
           E(6, "fabric", "post", "r", "t", (2,))]
    assert [(s.start, s.end) for s in wire_spans(log)] == [(1, 3), (3, 6), (6, None)]
