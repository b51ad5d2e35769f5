"""Small pieces of parasim.nn checked by hand: placements' names, which vocabulary rows a rank owns,
gradients that add up over repeated backward passes (micro-batches)."""
import numpy as np

import parasim
from parasim.nn import Saved, TPContext
from parasim.nn.core import Partial, Replicate, Shard
from parasim.nn.embedding import VocabParallelEmbedding, _owned


def test_placements_name_themselves():
    assert [str(p) for p in (Replicate(), Shard(1), Partial())] == ["replicated", "sharded on dim 1", "partial sum"]


def test_each_rank_owns_a_contiguous_block_of_the_vocabulary():
    ids = np.array([[0, 3, 4, 7, 5]])

    def prog(ctx):
        return _owned(TPContext(ctx, ctx.new_group([0, 1], "tp")), ctx.asarray(ids, "int64"), 8)

    rank0, rank1 = parasim.run(prog, world=2).values
    # rank 0 owns ids 0-3 (columns 0-3), rank 1 ids 4-7; a row is all zero where the other rank owns the id
    assert rank0.dtype == np.float64
    assert rank0[0].tolist() == [[1, 0, 0, 0], [0, 0, 0, 1], [0] * 4, [0] * 4, [0] * 4]
    assert rank1[0].tolist() == [[0] * 4, [0] * 4, [1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]]


def test_embedding_grads_add_up_over_backward_passes():
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1], [3], [1]])  # [s=3, b=1]: token 1 twice
    dy = np.arange(9.0).reshape(3, 1, 3)

    def prog(ctx):
        emb = VocabParallelEmbedding(TPContext(ctx), table)
        y, cache = emb.forward(ctx.asarray(ids, "int64"), Saved())
        emb.backward(cache, ctx.asarray(dy))
        once = emb.grads["weight"].copy()
        emb.backward(cache, ctx.asarray(dy))
        return y, once, emb.grads["weight"]

    ((y, once, twice),) = parasim.run(prog, world=1).values
    assert y[:, 0].tolist() == [table[1].tolist(), table[3].tolist(), table[1].tolist()]
    # row 1 gets dy of tokens 0 and 2, row 3 that of token 1, rows 0 and 2 nothing
    assert once.tolist() == [[0, 0, 0], [0 + 6, 1 + 7, 2 + 8], [0, 0, 0], [3, 4, 5]]
    assert twice.tolist() == (2 * once).tolist()
