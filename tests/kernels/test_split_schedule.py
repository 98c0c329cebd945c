"""The token-balanced split-KV schedule (kernels._split_kv.balanced_piece) on its own: every
tile of every sequence in exactly one work item, no more items than the grid, the shortest
longest piece the grid allows above the pieces' floor (kernels._split_kv.piece_floor), and the
merge's item ranges.

A small kernel runs the device function once per work item (in Triton's interpreter on a
host without CUDA) and writes what each item got.
"""

import pytest
import torch
import triton
import triton.language as tl

from kernels._split_kv import balanced_piece, piece_floor, schedule_lanes
from tests.kernels.conftest import DEVICE, ON_GPU

pytestmark = pytest.mark.usefixtures("kernel_runtime")


def _pieces_kernel_fn(
    work_ptr, pieces_ptr, sched_ptr, num_seqs, num_items, min_tiles, fill_items, SEQS_PAD: tl.constexpr
):
    item = tl.program_id(0)
    seqs = tl.arange(0, SEQS_PAD)
    work = tl.load(work_ptr + seqs, mask=seqs < num_seqs, other=0)
    floor = piece_floor(work, min_tiles, fill_items)
    seq, first, tiles = balanced_piece(work, seqs, num_seqs, item, num_items, floor, sched_ptr, item == 0)
    tl.store(pieces_ptr + 3 * item, seq)
    tl.store(pieces_ptr + 3 * item + 1, first)
    tl.store(pieces_ptr + 3 * item + 2, tiles)


if ON_GPU:
    _pieces_kernel = triton.jit(_pieces_kernel_fn)
else:
    from triton.runtime.interpreter import InterpretedFunction

    _pieces_kernel = InterpretedFunction(_pieces_kernel_fn)


def schedule(
    work: list[int], num_items: int, min_tiles: int, fill_items: int, wide: bool = True
) -> tuple[list[tuple[int, int, int]], list[list[int]]]:
    """Each item's piece and the merge's item ranges, with the schedule vectors as wide as a
    launch makes them (``wide``: at least 32 lanes) or as the batch."""
    pieces = torch.full((num_items, 3), -1, dtype=torch.int32, device=DEVICE)
    sched = torch.full((len(work), 2), -1, dtype=torch.int32, device=DEVICE)
    work_t = torch.tensor(work, dtype=torch.int32, device=DEVICE)
    _pieces_kernel[(num_items,)](
        work_t, pieces, sched, len(work), num_items, min_tiles, fill_items, SEQS_PAD=schedule_lanes(len(work), wide)
    )
    return [tuple(row) for row in pieces.tolist()], sched.tolist()


def smallest_piece(work: list[int], num_items: int, min_tiles: int, fill_items: int) -> int:
    """Brute force: the shortest piece length, at least the floor, whose pieces fit the grid;
    the floor is ``min_tiles``, or a ``fill_items``-th of the batch's tiles where that is less."""
    floor = min(min_tiles, -(-sum(work) // fill_items))
    length = max(floor, 1, -(-sum(work) // num_items))
    while sum(-(-w // length) for w in work) > num_items:
        length += 1
    return length


@pytest.mark.parametrize(
    ("work", "num_items", "min_tiles", "fill_items"),
    [
        ([0], 4, 1, 1),
        ([0, 0, 0], 3, 1, 1),
        ([1], 5, 1, 1),
        ([9], 4, 1, 1),
        ([3, 0, 1, 17, 2, 2, 40, 5], 8, 1, 1),  # as many items as sequences: one piece each
        ([3, 0, 1, 17, 2, 2, 40, 5], 24, 1, 1),
        ([3, 0, 1, 17, 2, 2, 40, 5], 24, 8, 1),  # the floor on a piece's length
        ([100, 1, 1, 1, 1, 1], 16, 1, 1),  # one long sequence beside short ones
        ([7] * 12, 40, 1, 1),
        ([(i * 37) % 51 for i in range(30)], 34, 1, 1),  # a few items more than sequences
        ([(i * 37) % 51 for i in range(30)], 100, 2, 1),
        # The floor gives way where the batch has fewer tiles than fill_items floors (70
        # tiles < 24 x 8: pieces of 3), and holds where it has more (a long batch, a fill of 8).
        ([3, 0, 1, 17, 2, 2, 40, 5], 66, 8, 24),
        ([64], 66, 8, 33),
        ([40] * 12, 66, 8, 33),
        ([3, 0, 1, 17, 2, 2, 40, 5], 66, 8, 8),
    ],
)
def test_pieces_cover_every_tile_once(work: list[int], num_items: int, min_tiles: int, fill_items: int) -> None:
    pieces, sched = schedule(work, num_items, min_tiles, fill_items)
    used = [(item, seq, first, tiles) for item, (seq, first, tiles) in enumerate(pieces) if seq < len(work)]
    assert all(seq >= len(work) for seq, _, _ in pieces[len(used) :])  # items past the pieces exit
    longest = smallest_piece(work, num_items, min_tiles, fill_items)
    for seq, length in enumerate(work):
        mine = sorted((first, tiles, item) for item, s, first, tiles in used if s == seq)
        covered = [t for first, tiles, _ in mine for t in range(first, first + tiles)]
        assert covered == list(range(length)), f"sequence {seq}: tiles {covered}"
        assert all(0 < tiles <= longest for _, tiles, _ in mine)
        assert len(mine) == -(-length // longest)  # the piece length the kernel chose
        sizes = [tiles for _, tiles, _ in mine] or [0]
        assert max(sizes) - min(sizes) <= 1  # a sequence's pieces differ by a tile at most
        items = [item for _, _, item in mine]
        assert sched[seq] == [items[0] if items else sched[seq][0], len(items)]
        assert items == list(range(sched[seq][0], sched[seq][0] + len(items)))


@pytest.mark.parametrize("work", [[3, 0, 1, 17, 2, 2, 40, 5], [100, 1, 1, 1, 1, 1], [9, 4, 30]])
def test_lanes_past_the_batch_change_no_piece(work: list[int]) -> None:
    """A launch pads the schedule vectors to 32 lanes (fewer registers on sm_90); the lanes
    past the batch hold no tiles, so the pieces are the ones the batch's own width gives (an
    item past the pieces gets a sequence past the lanes, and exits either way)."""
    assert schedule_lanes(len(work)) == 32 and triton.next_power_of_2(len(work)) < 32
    (wide, wide_sched), (narrow, narrow_sched) = (schedule(work, 24, 2, 8, wide=w) for w in (True, False))
    assert wide_sched == narrow_sched
    assert len(wide) == len(narrow) and any(seq >= len(work) for seq, _, _ in wide)
    for (seq, first, tiles), (n_seq, n_first, n_tiles) in zip(wide, narrow, strict=True):
        assert (seq, first, tiles) == (n_seq, n_first, n_tiles) or min(seq, n_seq) >= len(work)
