"""The cluster's switch tree (networkx) and its hop costs; the coactivation GraphML export."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import yaml

from moeopt.cli import main
from moeopt.dispatch import communication_of
from moeopt.instance import Cluster, TopologyLevel
from moeopt.io import load_instance, read_workload_file
from moeopt.topology import cluster_graph, hop_cost_sum, hop_costs

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = sorted((ROOT / "instances").glob("*.yaml"))
QUICK_TRACE = ROOT / "instances" / "traces" / "quickstart-calib.npz"


def two_level(cluster: Cluster) -> np.ndarray:
    """The hop costs as dispatch computed them before moeopt.topology."""
    g = np.arange(cluster.gpus)
    same_node = g[:, None] // cluster.gpus_per_node == g[None, :] // cluster.gpus_per_node
    cost = np.where(same_node, 1.0, cluster.inter_node_weight)
    cost[g, g] = 0.0
    return cost


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.stem)
def test_bundled_instances_keep_the_two_level_costs(path: Path) -> None:
    """Every bundled instance: hop costs and their column sum equal the old two-level formula."""
    cluster = load_instance(path).cluster
    assert np.array_equal(hop_costs(cluster), two_level(cluster))
    G, gpn, w = cluster.gpus, cluster.gpus_per_node, cluster.inter_node_weight
    assert hop_cost_sum(cluster) == (gpn - 1) + (G - gpn) * w


@pytest.mark.parametrize("gpus, gpn, w", [(8, 2, 0.3), (12, 3, 2.7), (6, 1, 4.0), (5, 5, 4.0), (16, 4, 0.0)])
def test_two_level_default_is_exact(gpus: int, gpn: int, w: float) -> None:
    """The default tree reproduces 0 / 1 / inter_node_weight exactly, even for w < 1."""
    cluster = Cluster(gpus=gpus, gpus_per_node=gpn, slots_per_gpu=1, inter_node_weight=w)
    assert np.array_equal(hop_costs(cluster), two_level(cluster))
    assert hop_cost_sum(cluster) == (gpn - 1) + (gpus - gpn) * w


def test_three_levels_by_hand() -> None:
    """8 GPUs, 2 per node (1), 2 nodes per rack (4), racks on a spine (16): the hand matrix."""
    tree = (TopologyLevel(2, 1.0), TopologyLevel(2, 4.0), TopologyLevel(None, 16.0))
    cluster = Cluster(gpus=8, gpus_per_node=2, slots_per_gpu=1, topology=tree)
    block = np.array([[0, 1, 4, 4], [1, 0, 4, 4], [4, 4, 0, 1], [4, 4, 1, 0]], dtype=float)
    expected = np.block([[block, np.full((4, 4), 16.0)], [np.full((4, 4), 16.0), block]])
    assert np.array_equal(hop_costs(cluster), expected)
    graph = cluster_graph(cluster)
    assert nx.is_tree(graph) and graph.number_of_nodes() == 8 + 4 + 2 + 1
    assert hop_cost_sum(cluster) == 1 + 2 * 4 + 4 * 16


def test_weighted_comm_uses_the_topology() -> None:
    """A token at GPU 0 using GPUs 1, 2 and 4 pays 1 + 4 + 16; unknown homes pay the mean."""
    tree = (TopologyLevel(2, 1.0), TopologyLevel(2, 4.0), TopologyLevel(None, 16.0))
    cluster = Cluster(gpus=8, gpus_per_node=2, slots_per_gpu=1, topology=tree)
    gpu = np.array([[[1, 2, 4]]])
    _, remote, weighted = communication_of(gpu, cluster, np.array([0]))
    assert remote[0, 0] == 3 and weighted[0, 0] == 21.0
    _, _, expected = communication_of(gpu, cluster)
    assert expected[0, 0] == pytest.approx(3 * (1 + 2 * 4 + 4 * 16) / 8)


def _instance(tmp_path: Path, cluster: dict) -> Path:
    data = {
        "name": "tiny",
        "model": {"layers": 1, "experts": 8, "top_k": 2},
        "cluster": cluster,
        "workload": {"synthetic": {"tokens": 24, "steps": 2}},
        "method": {"name": "linear"},
    }
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_topology_field_loads(tmp_path: Path) -> None:
    """cluster.topology sets the levels and gpus_per_node (the first level's size)."""
    levels = [{"size": 2, "weight": 1}, {"size": 2, "weight": 4.0}, {"weight": 16.0}]
    cluster = load_instance(_instance(tmp_path, {"gpus": 8, "topology": {"levels": levels}})).cluster
    assert cluster.gpus_per_node == 2
    assert cluster.topology == (TopologyLevel(2, 1.0), TopologyLevel(2, 4.0), TopologyLevel(None, 16.0))
    assert hop_costs(cluster)[0].tolist() == [0, 1, 4, 4, 16, 16, 16, 16]


GOOD = [{"size": 2, "weight": 1.0}, {"size": 2, "weight": 4.0}, {"weight": 16.0}]


@pytest.mark.parametrize(
    "cluster, field, message",
    [
        ({"topology": {"levels": GOOD[:1]}}, "cluster.topology.levels", "at least 2"),
        ({"topology": {"levels": [{"weight": 1.0}, {"weight": 4.0}]}}, "cluster.topology.levels[0].size", "required"),
        (
            {"topology": {"levels": [GOOD[0], {"size": 2, "weight": 4.0}]}},
            "cluster.topology.levels[1].size",
            "top level",
        ),
        (
            {"topology": {"levels": [GOOD[0], GOOD[1], {"weight": 2.0}]}},
            "cluster.topology.levels[2].weight",
            "at least",
        ),
        ({"topology": {"levels": [{"size": 0, "weight": 1.0}, GOOD[2]]}}, "cluster.topology.levels[0].size", ">= 1"),
        ({"topology": {"levels": [{"size": 2, "weight": -1.0}, GOOD[2]]}}, "cluster.topology.levels[0].weight", ">= 0"),
        (
            {"topology": {"levels": [GOOD[0], {"size": 2, "weight": "x"}, GOOD[2]]}},
            "cluster.topology.levels[1].weight",
            "expected a number",
        ),
        ({"topology": {"levels": GOOD, "depth": 3}}, "cluster.topology.depth", "unknown field"),
        ({"topology": {"levels": [{"size": 3, "weight": 1.0}, GOOD[2]]}}, "cluster.topology.levels", "divides"),
        ({"topology": {"levels": GOOD}, "inter_node_weight": 4.0}, "cluster.inter_node_weight", "found both"),
        ({"topology": {"levels": GOOD}, "gpus_per_node": 4}, "cluster.gpus_per_node", "levels[0].size=2"),
    ],
)
def test_bad_topology_is_one_line(cluster: dict, field: str, message: str, tmp_path: Path, capsys) -> None:
    """Each bad topology field: exit 2 and one line naming the file and the field."""
    path = _instance(tmp_path, {"gpus": 8, **cluster})
    code = main(["solve", str(path), "--quiet", "--output", str(tmp_path / "plan.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}: {field}:"), err
    assert message in err, err


def test_graphml_round_trip(tmp_path: Path, capsys) -> None:
    """trace stats --graphml: E nodes with loads, edge weights = the layer's coactivation."""
    out = tmp_path / "coact.graphml"
    assert main(["trace", "stats", str(QUICK_TRACE), "--graphml", str(out), "--layer", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    stats = read_workload_file(QUICK_TRACE).stats()
    graph = nx.read_graphml(out, node_type=int)
    E = stats.experts
    assert graph.number_of_nodes() == E and graph.graph["layer"] == 1
    weights = nx.to_numpy_array(graph, nodelist=range(E), weight="weight")
    assert np.allclose(weights, stats.affinity[1], rtol=0, atol=1e-15)
    assert graph.number_of_edges() == int((np.triu(stats.affinity[1], 1) > 0).sum())
    loads = [graph.nodes[e]["load"] for e in range(E)]
    assert np.array_equal(loads, stats.expert_load[1])


def test_graphml_with_plan_and_errors(tmp_path: Path, capsys) -> None:
    """--plan adds each expert's GPU; a layer out of range is one line and writes nothing."""
    plan = tmp_path / "plan.json"
    assert (
        main(
            [
                "solve",
                str(ROOT / "instances" / "quickstart.yaml"),
                "--method",
                "linear",
                "--quiet",
                "--output",
                str(plan),
            ]
        )
        == 0
    )
    out = tmp_path / "coact.graphml"
    assert main(["trace", "stats", str(QUICK_TRACE), "--graphml", str(out), "--plan", str(plan)]) == 0
    graph = nx.read_graphml(out, node_type=int)
    gpus_in_plan = json.loads(plan.read_text())["gpus"]  # linear: experts in order, E / G per GPU
    gpus = [graph.nodes[e]["gpu"] for e in range(graph.number_of_nodes())]
    assert gpus == sorted(gpus) and len(set(gpus)) == gpus_in_plan
    capsys.readouterr()
    bad = tmp_path / "bad.graphml"
    assert main(["trace", "stats", str(QUICK_TRACE), "--graphml", str(bad), "--layer", "99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--layer" in err, err
    assert not bad.exists()
