"""CPU atomics for numba code on memory other processes write too (an MPI shared-memory window).

``atomic_add(a, i, v)`` adds ``v`` to ``a[i]`` in one indivisible read-modify-write (LLVM
``atomicrmw``: ``fadd`` for floats, ``add`` for integers) and returns the old value;
``atomic_load(a, i)`` reads ``a[i]`` whole. No bounds checks: callers pass valid indices.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _pointer(context, builder, array_type, array, index):
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index], wraparound=False)


@intrinsic
def atomic_add(typingctx, array, index, value):
    """``old = a[i]; a[i] += v`` atomically (relaxed order); returns ``old``."""
    if not (isinstance(array, types.Array) and array.ndim == 1
            and isinstance(array.dtype, (types.Float, types.Integer))):
        return None
    sig = array.dtype(array, types.intp, array.dtype)

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        op = "fadd" if isinstance(signature.args[0].dtype, types.Float) else "add"
        return builder.atomic_rmw(op, ptr, args[2], "monotonic")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, array, index):
    """``a[i]``, read in one piece (acquire order)."""
    if not (isinstance(array, types.Array) and array.ndim == 1
            and isinstance(array.dtype, (types.Float, types.Integer))):
        return None
    sig = array.dtype(array, types.intp)

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", signature.args[0].dtype.bitwidth // 8)

    return sig, codegen


@intrinsic
def atomic_add_pair(typingctx, array, index, first, second):
    """``a[i] += first; a[i + 1] += second`` in one 8-byte compare-and-swap loop (each element's
    add indivisible, as :func:`atomic_add`'s); ``&a[i]`` must be 8-byte aligned (float32 ``a``)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.float32):
        return None
    sig = types.void(array, types.intp, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        word = ir.IntType(64)
        pair = ir.VectorType(ir.FloatType(), 2)
        wptr = builder.bitcast(ptr, word.as_pointer())
        add = builder.insert_element(builder.insert_element(ir.Constant(pair, None), args[2],
                                                            ir.Constant(ir.IntType(32), 0)),
                                     args[3], ir.Constant(ir.IntType(32), 1))
        start = builder.load_atomic(wptr, "monotonic", 8)
        entry = builder.block
        loop = builder.append_basic_block("pair_cas")
        done = builder.append_basic_block("pair_done")
        builder.branch(loop)
        builder.position_at_end(loop)
        current = builder.phi(word)
        current.add_incoming(start, entry)
        new = builder.bitcast(builder.fadd(builder.bitcast(current, pair), add), word)
        result = builder.cmpxchg(wptr, current, new, "monotonic", "monotonic")
        current.add_incoming(builder.extract_value(result, 0), loop)
        builder.cbranch(builder.extract_value(result, 1), done, loop)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen
