"""A randomized model of the decode kernel's stage ring (src/kernels/sm90/paged_kernel.cuh,
"Pipeline" and "CTA pairs"), run over many interleavings: no mbarrier takes more arrivals than
its phase expects, every math warpgroup reads its own tile's complete bytes, no TMA write lands in
a stage that a reader of that CTA still holds, and nothing waits forever.

What it models, as the kernel does it: tile t goes to math warpgroup t % W and stage t % S, its
producer is loading warp t % L; a producer waits for the stage's empty barrier (parity), arrives
on its full barrier expecting the tile's bytes (and, in a pair, on the other CTA's full barrier),
then its half of the tile lands on both CTAs after a random delay (none where its half holds no
block). A math thread waits for the full barrier, reads the stage's scales, joins the
warpgroup's MMA, which reads the stage until it completes, then arrives on its empty barrier,
and in a pair on the other CTA's. Arrivals on the other CTA's barriers travel: each lands after a
random delay (a step lands one with the chance `remote_landing`), in any order (relaxed arrivals
to different addresses are not ordered). A warpgroup is modelled by a few threads, each standing
for one of its warps (the kernel's remote arrival is a warp's, for its 32 lanes); the real counts
only scale the arrivals.
"""
import random

import pytest

HALF_BYTES = 10


class Barrier:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def arrive(self, n=1, expect_bytes=0):
        self.tx += expect_bytes
        self.pending -= n
        assert self.pending >= 0, f"over-arrival on {self.name} in phase {self.phase}"
        self._complete_phase()

    def complete_bytes(self, n):
        self.tx -= n
        self._complete_phase()

    def _complete_phase(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):  # mbarrier.try_wait.parity
        return (self.phase & 1) != parity


def run_ring(seed, paired, producers_on_both_full=True, stages=4, tiles=48, threads=4,
             loaders=4, warpgroups=2, empty_half=0.3, remote_landing=0.03,
             release_per_warp=True):
    rnd = random.Random(seed)
    ctas = 2 if paired else 1
    full_count = 2 if paired and producers_on_both_full else 1
    full = [[Barrier(f"full {c}.{s}", full_count) for s in range(stages)] for c in range(ctas)]
    empty = [[Barrier(f"empty {c}.{s}", threads * ctas) for s in range(stages)]
             for c in range(ctas)]
    # Whether CTA h's half of tile t holds a block (both CTAs compute the same mask).
    has_half = [[rnd.random() >= empty_half for _ in range(ctas)] for _ in range(tiles)]
    tile_bytes = [sum(HALF_BYTES for h in range(ctas) if has_half[t][h]) if paired
                  else HALF_BYTES for t in range(tiles)]
    landed = [[{} for _ in range(stages)] for _ in range(ctas)]  # stage: {tile: bytes}
    readers = [[set() for _ in range(stages)] for _ in range(ctas)]
    writes, mmas, remote, mma_state = [], [], [], {}

    def producer(c, warp):
        for t in range(warp, tiles, loaders):
            s, parity = t % stages, (t // stages) % 2
            while not empty[c][s].passed(parity ^ 1):
                yield
            full[c][s].arrive(1, expect_bytes=tile_bytes[t])
            if full_count == 2:
                remote.append((full[1 - c][s], 1))
            if not paired or has_half[t][c]:
                writes.extend((d, s, t) for d in range(ctas))
            yield

    def math_thread(c, group, thread):
        for t in range(group, tiles, warpgroups):
            s, parity = t % stages, (t // stages) % 2
            while not full[c][s].passed(parity):
                yield
            got = landed[c][s].get(t, 0)
            assert got == tile_bytes[t], f"CTA {c} read tile {t} with {got}/{tile_bytes[t]} bytes"
            readers[c][s].add(("scales", group, thread, t))
            yield
            readers[c][s].discard(("scales", group, thread, t))
            state = mma_state.setdefault((c, group, t), {"joined": 0, "done": False})
            state["joined"] += 1
            if state["joined"] == threads:  # the warpgroup's MMA is issued
                readers[c][s].add(("mma", group, t))
                mmas.append((c, group, t, s))
            while not state["done"]:
                yield
            empty[c][s].arrive(1)
            if paired and release_per_warp:  # each warp for itself (release_stage)
                remote.append((empty[1 - c][s], 1))
            elif paired and thread == 0:  # the earlier form: thread 0 for the warpgroup
                remote.append((empty[1 - c][s], threads))
            yield

    live = [producer(c, w) for c in range(ctas) for w in range(loaders)]
    live += [math_thread(c, g, th) for c in range(ctas) for g in range(warpgroups)
             for th in range(threads)]
    for _ in range(500000):
        if not (live or writes or mmas or remote):
            return
        if remote and (not live or rnd.random() < remote_landing):
            barrier, count = remote.pop(rnd.randrange(len(remote)))
            barrier.arrive(count)
        elif mmas and rnd.random() < 0.3:
            c, group, t, s = mmas.pop(rnd.randrange(len(mmas)))
            readers[c][s].discard(("mma", group, t))
            mma_state[(c, group, t)]["done"] = True
        elif writes and (not live or rnd.random() < 0.3):
            d, s, t = writes.pop(rnd.randrange(len(writes)))
            assert not readers[d][s], f"tile {t} lands in CTA {d} stage {s} under {readers[d][s]}"
            landed[d][s] = {t: landed[d][s].get(t, 0) + HALF_BYTES}
            full[d][s].complete_bytes(HALF_BYTES)
        elif live:
            actor = rnd.choice(live)
            try:
                next(actor)
            except StopIteration:
                live.remove(actor)
    raise AssertionError("no progress: a wait that never returns")


# The kernel's shapes of the ring (paged_plan.cuh): two math warpgroups beside four loading
# warps, three beside three, four beside four, with stage counts that are multiples of the
# warpgroups and at least the loading warps; pairs run two beside four, with stage counts that
# are multiples of the loading warps (the launcher asserts it). Besides the smallest counts the
# rules allow, every count make_smem_layout gives an instance (H 8-64, D 32-128, fp32 and bf16
# weights): 10, 12, 24, 32 beside two warpgroups, 12, 24, 30 beside three, 12, 24, 32 beside
# four, and 12, 24, 32 for the pairs.
KERNEL_RINGS = [(2, 4, stages) for stages in (4, 6, 10, 12, 24, 32)] + \
               [(3, 3, stages) for stages in (3, 6, 12, 24, 30)] + \
               [(4, 4, stages) for stages in (4, 8, 12, 24, 32)]
PAIR_STAGES = (4, 8, 12, 24, 32)


@pytest.mark.parametrize("warpgroups,loaders,stages", KERNEL_RINGS)
def test_the_ring_holds_over_random_interleavings(warpgroups, loaders, stages):
    for seed in range(40):
        for empty_half in (0.0, 0.3, 0.7):
            run_ring(seed, False, stages=stages, warpgroups=warpgroups, loaders=loaders,
                     empty_half=empty_half)


@pytest.mark.parametrize("stages", PAIR_STAGES)
@pytest.mark.parametrize("remote_landing", [1.0, 0.03])
def test_the_paired_ring_holds_over_random_interleavings(stages, remote_landing):
    for seed in range(40):
        for empty_half in (0.0, 0.3, 0.7):
            run_ring(seed, True, stages=stages, empty_half=empty_half,
                     remote_landing=remote_landing)


def test_a_pair_needs_a_stage_count_that_the_loading_warps_divide():
    """Six stages beside four loading warps: a warp's wait for a stage tells it of the other
    CTA's arrivals on that stage only, and those for another stage may land later."""
    with pytest.raises(AssertionError):
        for seed in range(40):
            run_ring(seed, True, stages=6, remote_landing=0.03)


def test_four_loading_warps_beside_three_warpgroups_break_the_ring():
    """paged_kernel.cuh, Pipeline: with four loading warps beside three math warpgroups, a parity
    wait can take a stage's phase from two uses back for its own. The model sees it."""
    with pytest.raises(AssertionError):
        for seed in range(40):
            run_ring(seed, False, stages=6, warpgroups=3, loaders=4)


def test_a_pair_needs_both_producers_on_each_full_barrier():
    """With one remote release for a warpgroup (its thread 0's, as the kernel had it) and without
    the other producer's arrival, a CTA whose partner's half of a tile is empty can run a stage
    ahead: its arrival lands on the partner's empty barrier before that phase had all its local
    arrivals. The model finds it within a few hundred interleavings. (Released per warp, each
    warp's remote arrival follows its own local one, and the model finds nothing either way; the
    kernel keeps both producers' arrivals.)"""
    failures = 0
    for seed in range(400):
        try:
            run_ring(seed, True, producers_on_both_full=False, remote_landing=0.5,
                     release_per_warp=False)
        except AssertionError as error:
            assert "over-arrival" in str(error) or "lands in" in str(error), error
            failures += 1
    assert failures > 0
