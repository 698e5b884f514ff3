"""Node choice: eligibility, then least run, post-run and init pressure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from polar.rollout.scheduler import NodeLoad, choose_node, plan


def load(node_id: str, **kw: object) -> NodeLoad:
    base: dict[str, object] = dict(run_workers=4, postrun_workers=2, init_workers=2, capacity=10)
    return NodeLoad(node_id=node_id, **{**base, **kw})  # type: ignore[arg-type]


def test_skips_unhealthy_draining_and_full_nodes() -> None:
    nodes = [
        load("sick", healthy=False),
        load("leaving", draining=True),
        load("full", capacity=0),
        load("busy", before_run=30),
    ]
    chosen = choose_node(nodes)
    assert chosen is not None and chosen.node_id == "busy"
    assert choose_node(nodes[:3]) is None


def test_run_pressure_decides_first_relative_to_run_workers() -> None:
    small = load("small", run_workers=1, before_run=1)  # pressure 1.0
    big = load("big", run_workers=8, before_run=4, in_postrun=9, in_init=9)  # 0.5
    assert choose_node([small, big]) is big


def test_postrun_then_init_pressure_break_ties() -> None:
    a = load("a", before_run=2, in_postrun=2, in_init=0)
    b = load("b", before_run=2, in_postrun=1, in_init=2)
    assert choose_node([a, b]) is b
    c = load("c", before_run=2, in_postrun=1, in_init=1)
    assert choose_node([a, b, c]) is c


def test_plan_balances_by_run_slots_and_stops_when_full() -> None:
    nodes = [load("a", run_workers=2, capacity=17), load("b", run_workers=6, capacity=3)]
    chosen = plan(nodes, 30)
    assert chosen.count("b") == 3  # its capacity
    assert chosen.count("a") == 17
    assert plan(nodes, 5) == []  # both full now


def test_plan_spreads_in_proportion_to_run_workers() -> None:
    nodes = [load("a", run_workers=2, capacity=100), load("b", run_workers=6, capacity=100)]
    chosen = plan(nodes, 16)
    assert (chosen.count("a"), chosen.count("b")) == (4, 12)


node_loads = st.builds(
    NodeLoad,
    node_id=st.text("abcdef", min_size=1, max_size=3),
    run_workers=st.integers(1, 8),
    postrun_workers=st.integers(1, 8),
    init_workers=st.integers(1, 8),
    capacity=st.integers(0, 20),
    before_run=st.integers(0, 40),
    in_postrun=st.integers(0, 40),
    in_init=st.integers(0, 40),
    healthy=st.booleans(),
    draining=st.booleans(),
)


@given(st.lists(node_loads, max_size=6))
def test_choice_is_an_eligible_node_with_minimal_pressure(nodes: list[NodeLoad]) -> None:
    chosen = choose_node(nodes)
    eligible = [n for n in nodes if n.healthy and not n.draining and n.capacity > 0]
    if not eligible:
        assert chosen is None
        return
    assert chosen is not None and chosen in eligible
    assert chosen.pressure() == min(n.pressure() for n in eligible)


@given(st.lists(node_loads, max_size=6, unique_by=lambda n: n.node_id), st.integers(0, 60))
def test_plan_fills_eligible_capacity_and_no_more(nodes: list[NodeLoad], sessions: int) -> None:
    before = {n.node_id: n.capacity for n in nodes}
    eligible_capacity = sum(n.capacity for n in nodes if n.healthy and not n.draining)
    chosen = plan(nodes, sessions)
    assert len(chosen) == min(sessions, eligible_capacity)
    for n in nodes:
        assert n.capacity >= 0
        assert chosen.count(n.node_id) == before[n.node_id] - n.capacity
        if not n.healthy or n.draining:
            assert n.node_id not in chosen
