"""The page map tells a read of another tenant's data from a read of memory nobody wrote, and the player
shows each frame's caption with that frame's picture."""

from __future__ import annotations

from minikv.engine.events import Event as E
from minikv.viz import ReplayWidget, page_styles, replay, tenant_colours
from minikv.viz.demo import MINIATURE_INCIDENT, MINIATURE_POOLS
from minikv.viz.page_map import _legend_handles

STEP = [  # alice writes pages 0-1 and frees them; bob gets 0-3, and one step reads all four
    E(0, "decode", "allocate", "a1", "alice", (0, 1)), E(0, "decode", "write", "a1", "alice", (0, 1)),
    E(1, "decode", "free", "a1", "alice", (0, 1)), E(2, "decode", "allocate", "b1", "bob", (0, 1, 2, 3)),
    E(2, "decode", "cross_read", "b1", "bob", (0, 1), "victim=alice/a1"),
    E(2, "decode", "cross_read", "b1", "bob", (2, 3), "victim=never-written"),
]


def test_unwritten_reads_are_not_marked_as_cross_tenant_reads():
    """In the step where bob reads alice's two pages and two nobody wrote, only alice's are red; the other two
    are unwritten reads, now and ever after."""
    state = replay(STEP, 4)["decode"]
    styles = page_styles(state, tenant_colours(["alice", "bob"]))
    assert [s.page for s in styles if s.cross_read] == [0, 1]
    assert [s.page for s in styles if s.unwritten_read] == [2, 3]
    assert state.cross_read_ever == {0, 1} and state.unwritten_read_ever == {2, 3}


def test_the_legend_names_each_kind_of_read_once_it_is_drawn():
    """A red entry for alice's pages, a grey one for the unwritten; with no unwritten read, no grey entry."""
    colours = tenant_colours(["alice", "bob"])
    styles = page_styles(replay(STEP, 4)["decode"], colours)
    labels = [h.get_label() for h in _legend_handles(styles, colours, None)]
    assert any("across tenants" in label for label in labels)
    assert any("nobody had written" in label for label in labels)
    alone = replay(STEP[:-1], 4)["decode"]
    assert not any("nobody had written" in h.get_label() for h in _legend_handles(page_styles(alone, colours),
                                                                                   colours, None))


def test_the_player_shows_a_caption_only_with_its_own_picture():
    """When the caption changes, the image already holds that frame's page map (not the previous frame's)."""
    player = ReplayWidget(MINIATURE_INCIDENT, MINIATURE_POOLS, start=-1)
    seen_with_caption: list[bytes] = []
    player.caption.observe(lambda _: seen_with_caption.append(bytes(player.image.value)), names="value")
    for frame in (1, 2, 3):
        player.slider.value = frame
        assert seen_with_caption[-1] == bytes(player.image.value), f"frame {frame}: caption ran ahead"


def test_the_ttft_line_follows_the_median_a_stalled_run_cannot_drag():
    """Three rounds at each length, one stalled 50x: the dashed line passes through each length's median."""
    from minikv.engine.request import Response, Usage
    from minikv.viz import ttft_plot

    times = {100: [10, 11, 500], 400: [40, 41, 42], 800: [80, 81, 82]}  # ms; one stalled run at 100 tokens
    responses = [Response(f"r{n}-{i}", "alice", 200, usage=Usage(n, 1), ttft_s=ms / 1000)
                 for n, runs in times.items() for i, ms in enumerate(runs)]
    [line] = [ln for ln in ttft_plot(responses).figure.axes[0].lines if ln.get_linestyle() == "--"]
    assert list(line.get_xdata()) == [100, 400, 800]
    assert [round(y) for y in line.get_ydata()] == [11, 41, 81]
