"""The generated mutants: the operators' sites, the committed manifest, and a few mutants rebuilt
from the sources and run in Triton's interpreter (fp16) against fixed, on the manifest's probe
shapes. The whole measurement is ``scripts/generate_mutants.py`` (half an hour); here the
recorded evidence of a few ids is reproduced, to the bit, through the launchers' ``variant=``.
"""

from __future__ import annotations

import functools
import random
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kernels import generated_mutants, mutants, mutation_ops
from kernels.generated_mutants import HALVES, manifest

MANIFEST = manifest()


def test_the_operators_generate_at_least_50_mutants_the_same_way_every_time() -> None:
    first, again = mutation_ops.sites(), mutation_ops.sites()
    assert first == again and len(first) >= 50
    assert len({site.id for site in first}) == len(first)
    assert len({site.operator for site in first}) == len(mutation_ops.OPERATORS)  # every operator finds a site
    assert {site.file for site in first} == set(mutation_ops.FILES)
    for site in first:
        assert site.id == f"gen_{site.operator}_{site.file}_{site.id.rsplit('_', 1)[1]}" and site.before != site.after


def test_the_manifest_records_every_mutant_of_the_current_sources() -> None:
    """A kernel edit that moves a site fails here: run scripts/generate_mutants.py again."""
    recorded = [(m.id, m.function, m.before, m.after) for m in MANIFEST.mutants]
    assert recorded == [(s.id, s.function, s.before, s.after) for s in mutation_ops.sites()]
    counts = Counter(m.status for m in MANIFEST.mutants)
    assert counts["kept"] >= 50 and counts["equivalent"] > 0, counts
    shapes = set(MANIFEST.shapes)
    for mutant in MANIFEST.mutants:
        measured = set(mutant.evidence)
        assert measured <= shapes or set(mutant.evidence) == {"all"}, mutant.id  # "all": died or hung
        zero = all(value == 0.0 for value in mutant.evidence.values())
        assert (mutant.status == "equivalent") == zero, mutant.id
        assert (mutant.half is not None) == (mutant.status == "kept"), mutant.id


def test_the_split_is_the_seeds_and_the_halves_are_disjoint() -> None:
    kept = list(MANIFEST.kept)
    shuffled = random.Random(MANIFEST.seed).sample(kept, len(kept))
    tuning, held_out = MANIFEST.half("tuning"), MANIFEST.half("held-out")
    assert set(tuning) == set(shuffled[: len(kept) // 2]) and set(held_out) == set(shuffled[len(kept) // 2 :])
    assert not set(tuning) & set(held_out) and sorted(tuning + held_out) == sorted(kept)
    assert set(mutants.GENERATED) == set(kept) and set(kept) <= set(mutants.VARIANTS)
    assert mutants.batch(None, "held-out") == held_out and mutants.batch(None, None) == list(mutants.MUTANTS)
    with pytest.raises(ValueError, match="half must be one of tuning, held-out"):
        mutants.batch(None, "both")
    assert HALVES == ("tuning", "held-out")


def _first(status: str, operator: str, file: str) -> generated_mutants.Generated:
    return next(m for m in MANIFEST.mutants if (m.status, m.operator, m.file) == (status, operator, file))


def _differing_shape(mutant: generated_mutants.Generated) -> str:
    return next(shape for shape, value in mutant.evidence.items() if isinstance(value, float) and value > 0)


def _with_variant(entry: Callable[..., None], chosen: str, *args: Any, **kwargs: Any) -> None:
    """``entry`` called as the probes call it, with the variant ``chosen`` in place of theirs ("fixed")."""
    entry(*args, **{**kwargs, "variant": chosen})


@pytest.mark.usefixtures("kernel_runtime")
@pytest.mark.parametrize(
    ("operator", "file"), [("narrow_acc", "unified"), ("bf16_const", "decode"), ("swap_minmax", "splitkv")]
)
def test_a_kept_mutant_differs_from_fixed_as_recorded(operator: str, file: str) -> None:
    """The launchers take the id as ``variant=``; the difference is the manifest's, to the bit."""
    from kernels import mutant_probes
    from kernels.decode_attention import decode_attention_fwd
    from kernels.unified_attention import unified_attention

    mutant = next(
        m for m in MANIFEST.mutants if (m.status, m.operator, m.file) == ("kept", operator, file) and any(
            isinstance(v, float) and v > 0 for v in m.evidence.values())
    )  # fmt: skip
    shape = mutant_probes.SHAPE_NAMES[_differing_shape(mutant)]
    entries: dict[str, mutant_probes.Entry] = {
        "unified_attention": unified_attention,
        "decode_attention_fwd": decode_attention_fwd,
    }
    entry = entries[shape.kernel]

    def as_variant(variant: str) -> mutant_probes.Entry:
        return functools.partial(_with_variant, entry, variant)

    fixed = mutant_probes.run(shape, as_variant("fixed"))
    changed = mutant_probes.run(shape, as_variant(mutant.id))
    recorded = mutant.evidence[shape.name]
    assert isinstance(recorded, float) and recorded > 0
    assert mutant_probes.difference(fixed, changed) == recorded
    assert mutant_probes.difference(fixed, mutant_probes.run(shape, as_variant("fixed"))) == 0.0


@pytest.mark.usefixtures("kernel_runtime")
def test_an_equivalent_mutant_is_recorded_with_its_evidence_and_computes_fixed() -> None:
    from kernels import mutant_probes
    from kernels.unified_attention import unified_attention

    mutant = _first("equivalent", "bf16_const", "unified")  # 1e-30 rounded: a floor no sum comes near
    assert mutant.half is None and mutant.id not in mutants.VARIANTS
    assert set(mutant.evidence) == {s.name for s in mutant_probes.SHAPES if s.kernel == "unified_attention"}
    assert set(mutant.evidence.values()) == {0.0}
    site = mutation_ops.Site(
        mutant.id, mutant.operator, mutant.file, mutant.function, mutant.line, mutant.before, mutant.after
    )
    family = generated_mutants.build_family(site)
    shape = mutant_probes.SHAPE_NAMES["prefill_b16"]
    built = family["kernels.unified_attention"].unified_attention
    assert built is not unified_attention
    assert mutant_probes.difference(mutant_probes.run(shape, unified_attention), mutant_probes.run(shape, built)) == 0.0


def test_a_family_rebuilds_the_mutated_file_and_what_imports_it_and_leaves_fixed_alone() -> None:
    import kernels._decode_kernel
    import kernels._unified_kernel
    import kernels.unified_attention

    mutant = _first("kept", "narrow_acc", "unified")
    family = generated_mutants.family(mutant.id)
    assert family["kernels._split_kv"] is sys.modules["kernels._split_kv"]  # upstream of the mutated file
    assert family["kernels._decode_kernel"] is kernels._decode_kernel  # not on its path
    assert family["kernels.decode_attention"] is sys.modules["kernels.decode_attention"]
    rebuilt = family["kernels._unified_kernel"]
    assert rebuilt is not kernels._unified_kernel
    assert rebuilt.__name__ == f"kvcanary_generated.{mutant.id}._unified_kernel"
    assert family["kernels.unified_attention"]._unified_attention_kernel is rebuilt._unified_attention_kernel
    # The fixed modules keep their own programs; the mutated source is served to Triton by linecache.
    assert kernels.unified_attention._unified_attention_kernel is kernels._unified_kernel._unified_attention_kernel
    import inspect
    import linecache

    assert mutant.after in inspect.getsource(rebuilt)
    assert mutant.after not in inspect.getsource(kernels._unified_kernel)
    assert rebuilt.__file__ is not None and linecache.getlines(rebuilt.__file__)


def test_a_site_the_sources_no_longer_hold_is_refused_with_what_to_run() -> None:
    site = mutation_ops.sites()[0]
    moved = mutation_ops.Site(site.id, site.operator, site.file, site.function, site.line, "x < y", site.after)
    with pytest.raises(ValueError, match=r"run scripts/generate_mutants\.py again"):
        mutation_ops.mutated_tree(moved)


def test_unknown_ids_are_refused_with_where_the_variants_are_listed() -> None:
    for call in (
        lambda: mutants.check_variant("unified_attention", "gen_no_such_site_0"),
        lambda: mutants.batch(["gen_no_such_site_0"], None),
    ):
        with pytest.raises(ValueError, match=r"kernels/generated_mutants\.json") as refused:
            call()
        assert "gen_no_such_site_0" in str(refused.value) and "kernels/mutants.py" in str(refused.value)
    equivalent = _first("equivalent", "bf16_const", "unified").id  # measured, but no variant
    with pytest.raises(ValueError, match="no kernel variant"):
        mutants.check_variant("decode_attention_fwd", equivalent)
    with pytest.raises(KeyError, match="no kept generated mutant"):
        generated_mutants.family(equivalent)
