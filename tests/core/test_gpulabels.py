"""The GPU labeler's reading and deciding, on values: real nvidia-smi lines from seven cards
(``tests.support.nvidia_smi`` says where each comes from), mixed nodes, and broken answers."""

from __future__ import annotations

import pytest

from rebalancer.core import gpulabels
from rebalancer.core.gpulabels import (
    COUNT,
    FAMILY,
    GFD_TIMESTAMP,
    MAJOR,
    MEMORY,
    MINOR,
    MIXED,
    PRODUCT,
    Stand,
    Unreadable,
)
from tests.support import nvidia_smi as smi


def labels_of(stdout: str) -> dict[str, str]:
    gpus = gpulabels.read(stdout)
    assert not isinstance(gpus, Unreadable), gpus
    return gpulabels.node_labels(gpus)


# Card -> (count on the node, the labels a node of them gets).
EXPECTED: dict[str, tuple[int, dict[str, str]]] = {
    "A100": (8, {PRODUCT: "NVIDIA-A100-SXM4-80GB", MEMORY: "81920", MAJOR: "8", MINOR: "0",
                 FAMILY: "ampere"}),
    "H100": (8, {PRODUCT: "NVIDIA-H100-80GB-HBM3", MEMORY: "81559", MAJOR: "9", MINOR: "0",
                 FAMILY: "hopper"}),
    "H200": (8, {PRODUCT: "NVIDIA-H200", MEMORY: "143771", MAJOR: "9", MINOR: "0",
                 FAMILY: "hopper"}),
    "L20": (4, {PRODUCT: "NVIDIA-L20", MEMORY: "46068", MAJOR: "8", MINOR: "9", FAMILY: "ada"}),
    "L40S": (4, {PRODUCT: "NVIDIA-L40S", MEMORY: "46068", MAJOR: "8", MINOR: "9",
                 FAMILY: "ada"}),
    "T4": (1, {PRODUCT: "Tesla-T4", MEMORY: "15360", MAJOR: "7", MINOR: "5", FAMILY: "turing"}),
    "B200": (8, {PRODUCT: "NVIDIA-B200", MEMORY: "183359", MAJOR: "10", MINOR: "0",
                 FAMILY: "blackwell"}),
}  # fmt: skip


@pytest.mark.parametrize("card", list(EXPECTED))
def test_each_card_gives_gfds_keys_and_units(card: str) -> None:
    count, expected = EXPECTED[card]
    assert labels_of(smi.node_of(smi.CARDS[card], count)) == {**expected, COUNT: str(count)}


def test_memory_with_its_unit_reads_the_same() -> None:
    assert labels_of("NVIDIA H100 80GB HBM3, 81559 MiB, 9.0\n")[MEMORY] == "81559"


@pytest.mark.parametrize(
    ("capability", "family"),
    [("7.5", "turing"), ("8.0", "ampere"), ("8.6", "ampere"), ("8.9", "ada"), ("9.0", "hopper"),
     ("10.0", "blackwell"), ("10.3", "blackwell"), ("12.0", "blackwell"), ("12.1", "blackwell")],
)  # fmt: skip
def test_the_family_comes_from_the_compute_capability(capability: str, family: str) -> None:
    # A name that would say otherwise: the capability wins.
    assert labels_of(f"NVIDIA T4, 16000, {capability}\n")[FAMILY] == family


@pytest.mark.parametrize("capability", ["7.0", "8.7", "6.1", "11.0"])
def test_a_capability_outside_the_five_families_gives_no_family(capability: str) -> None:
    labels = labels_of(f"Some GPU, 16000, {capability}\n")
    assert FAMILY not in labels
    assert (labels[MAJOR], labels[MINOR]) == tuple(capability.split("."))


@pytest.mark.parametrize(
    ("line", "family"),
    [(smi.T4, "turing"), (smi.A100, "ampere"), (smi.L40S, "ada"), (smi.L20, "ada"),
     (smi.H100, "hopper"), (smi.H200, "hopper"), (smi.B200, "blackwell")],
)  # fmt: skip
def test_without_a_capability_the_family_comes_from_the_name(line: str, family: str) -> None:
    name, memory, _ = line.split(", ")
    for missing in ("[N/A]", "N/A", "[Not Supported]"):
        labels = labels_of(f"{name}, {memory}, {missing}\n")
        assert labels[FAMILY] == family
        assert MAJOR not in labels
        assert MINOR not in labels
    # An old driver asked without compute_cap.
    gpus = gpulabels.read(f"{name}, {memory}\n", gpulabels.QUERY_WITHOUT_CAPABILITY)
    assert not isinstance(gpus, Unreadable)
    assert gpulabels.node_labels(gpus)[FAMILY] == family


def test_an_unknown_name_without_a_capability_gives_no_family() -> None:
    labels = labels_of("NVIDIA Mystery 9000, 16000, [N/A]\n")
    assert labels.keys() == {PRODUCT, MEMORY, COUNT}


# ---------------------------------------------------------------------------------------------
# Mixed GPUs: the weakest speaks for the node


def test_on_a_mixed_node_no_label_promises_more_than_the_weakest_gpu() -> None:
    stdout = smi.node_of(smi.H100, 7) + smi.A100 + "\n"
    assert labels_of(stdout) == {
        PRODUCT: "NVIDIA-A100-SXM4-80GB",
        MEMORY: "81559",  # the H100's: smaller than the A100's 81920
        COUNT: "8",
        MAJOR: "8",
        MINOR: "0",
        FAMILY: "ampere",
        MIXED: "true",
    }


def test_the_least_memory_and_the_lowest_capability_may_come_from_different_gpus() -> None:
    labels = labels_of(f"{smi.L40S}\n{smi.A100}\n")
    assert (labels[MEMORY], labels[MAJOR], labels[MINOR]) == ("46068", "8", "0")
    assert (labels[PRODUCT], labels[FAMILY]) == ("NVIDIA-A100-SXM4-80GB", "ampere")


def test_one_gpu_without_a_capability_takes_the_capability_labels_off_the_node() -> None:
    labels = labels_of(f"{smi.H100}\nNVIDIA H100 80GB HBM3, 81559, [N/A]\n")
    assert MAJOR not in labels
    assert MINOR not in labels
    assert labels[FAMILY] == "hopper"  # from the name, and every GPU's family is known
    assert MIXED not in labels  # one model


def test_one_gpu_of_no_known_family_takes_the_family_label_off_the_node() -> None:
    labels = labels_of(f"{smi.H100}\nTesla V100-SXM2-16GB, 16384, 7.0\n")
    assert FAMILY not in labels
    assert (labels[PRODUCT], labels[MAJOR], labels[MINOR]) == ("Tesla-V100-SXM2-16GB", "7", "0")


# ---------------------------------------------------------------------------------------------
# Answers that cannot be read


@pytest.mark.parametrize(
    ("stdout", "says"),
    [
        ("", "nvidia-smi listed no GPU"),
        ("\n\n", "nvidia-smi listed no GPU"),
        ("[Unknown Error], [Unknown Error], [Unknown Error]\n", "line 1: name '[Unknown Error]'"),
        (f"{smi.A100}\n[GPU requires reset], 81920, 8.0\n", "line 2: name '[GPU requires reset]'"),
        ("NVIDIA A100-SXM4-80GB, [N/A], 8.0\n", "line 1: memory.total '[N/A]'"),
        ("NVIDIA A100-SXM4-80GB, 80GB, 8.0\n", "line 1: memory.total '80GB'"),
        ("NVIDIA A100-SXM4-80GB, 0, 8.0\n", "line 1: memory.total '0'"),
        (
            "NVIDIA A100-SXM4-80GB, 81920, [Unknown Error]\n",
            "line 1: compute_cap '[Unknown Error]'",
        ),
        ("NVIDIA A100-SXM4-80GB, 81920, sm_80\n", "line 1: compute_cap 'sm_80'"),
        ("NVIDIA A100-SXM4-80GB, 81920\n", "line 1: expected 3 fields"),
        ("Segmentation fault (core dumped)\n", "line 1: expected 3 fields"),
        ("\x00\x7f\xfe garbage, 1, 2, 3\n", "line 1: expected 3 fields"),
        ("NVIDIA A100/80GB, 81920, 8.0\n", "line 1: name 'NVIDIA A100/80GB': not a label value"),
        (f"{'X' * 64}, 81920, 8.0\n", "not a label value"),
    ],
)
def test_an_answer_that_cannot_be_read_says_which_field_and_value(stdout: str, says: str) -> None:
    read = gpulabels.read(stdout)
    assert isinstance(read, Unreadable)
    assert says in read.reason
    assert "\n" not in read.reason


# ---------------------------------------------------------------------------------------------
# Against the node's labels


def gpus_of(stdout: str) -> tuple[gpulabels.Gpu, ...]:
    gpus = gpulabels.read(stdout)
    assert not isinstance(gpus, Unreadable)
    return gpus


def test_a_node_already_in_step_needs_no_change() -> None:
    gpus = gpus_of(smi.node_of(smi.H100, 8))
    current = {**gpulabels.node_labels(gpus), "kubernetes.io/hostname": "gpu-1"}
    assert gpulabels.decide(current, gpus) == gpulabels.Decision(Stand.LABEL, {})


def test_only_what_differs_is_changed_and_no_other_label_is_touched() -> None:
    gpus = gpus_of(smi.node_of(smi.H100, 7))
    current = {
        **gpulabels.node_labels(gpus_of(smi.node_of(smi.H100, 8))),
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "gpu-pool": "inference",
    }
    assert gpulabels.decide(current, gpus).changes == {COUNT: "7"}


def test_an_owned_label_the_hardware_no_longer_gives_is_removed() -> None:
    mixed = gpus_of(f"{smi.H100}\n{smi.A100}\n")
    uniform = gpus_of(f"{smi.H100}\n{smi.H100}\n")
    current = gpulabels.node_labels(mixed)
    changes = gpulabels.decide(current, uniform).changes
    assert changes[MIXED] is None
    assert changes[PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    no_capability = gpus_of("NVIDIA H100 80GB HBM3, 81559, [N/A]\n" * 2)
    changes = gpulabels.decide(gpulabels.node_labels(uniform), no_capability).changes
    assert changes == {MAJOR: None, MINOR: None}


def test_a_node_gpu_feature_discovery_labels_is_left_alone() -> None:
    gpus = gpus_of(smi.node_of(smi.H100, 8))
    current = {GFD_TIMESTAMP: "1728238737", PRODUCT: "NVIDIA-H100-80GB-HBM3", COUNT: "4"}
    assert gpulabels.decide(current, gpus) == gpulabels.Decision(Stand.GFD, {})
