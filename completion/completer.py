"""The Completer: from a few annotated values, the process mesh, dims_mapping and partial
status of every value and every op operand/result, and each op's pipeline chunk.

Behaviour matches Paddle auto-parallel's ``Completer`` (``complete_forward_annotation``,
``complete_backward_annotation``, ``complete_update_annotation``, ``complete_chunk_id``),
with these contracts:

- Annotations: a value whose ``dist_attr`` is set when completion starts (by
  :meth:`Program.annotate` / :func:`completion.annotate` or directly) is an annotation and
  is never overwritten. Attrs the Completer derived are recorded on the program, so
  completing again re-derives them from the annotations alone (completion is idempotent).
- Annotations are facts, never relabels: when an op cannot produce the layout its result
  is annotated with (a matmul contracting a sharded dim gives a Partial), the op's result
  attr is what it computes and the value keeps its annotation; the partition pass then
  reshards the result. A ``reshard`` op whose op dist attr is set when completion starts
  is a given reshard: its source and target are kept verbatim (its result value takes the
  target unless annotated), it runs on its given mesh, and the partition pass reshards
  its operand to the given source when they differ (:mod:`completion.propagate`).
- Process meshes first: an op takes the mesh of its first annotated result, else of its
  first operand that has one, else of the nearest op before it (after it, at the start).
  With pipeline stages (:meth:`complete_chunk_id` with pp_degree > 1) each op runs on its
  stage's sub-mesh: a mesh with a dim named ``pp`` is split along it; any other mesh is
  stage 0's, and stage s uses the same shape with ranks offset by ``s * mesh.size``.
  Annotations move to their stage's mesh (their dims_mapping kept, a ``pp`` entry dropped).
- Then dims_mapping: forward ops, then backward ops, then optimizer ops, each phase by
  forward and reverse sweeps to a fixed point (:mod:`completion.propagate`; at most 500
  sweeps, then a CompletionError naming the values still changing). Values of a completed
  phase are not changed by later phases. A source op (data, parameter, full) belongs to the
  phase of its first user (optimizer states are completed with the optimizer ops).
- Optimizer ops honour a ZeRO stage (:mod:`completion.zero`).
"""

from __future__ import annotations

from collections.abc import Sequence

from completion.chunks import DEFAULT_SEG_METHOD, ChunkPlan, assign_chunks
from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import CompletionError
from completion.gc_pause import gc_paused
from completion.ir import Operation, OpRole, Program, Value
from completion.mesh import ProcessMesh
from completion.propagate import MAX_SWEEPS, Propagator
from completion.zero import apply_zero

PHASES = {"forward": (OpRole.FORWARD, OpRole.LOSS), "backward": (OpRole.BACKWARD,),
          "update": (OpRole.OPTIMIZE,)}
DERIVED_ATTR = "_completion_derived"
DERIVED_OPS_ATTR = "_completion_derived_ops"


class Completer:
    """Completes the dist attrs of ``program`` in place (module docstring).

    Args:
        program: the program; at least one value must be annotated.
        zero_stage: ZeRO stage 0-3 for :meth:`complete_update_annotation`.
        dp_mesh_dim: the data-parallel mesh dim (index or name) for ZeRO; default: a dim
            named ``dp``, else the dim gradients are Partial over, else 0.
        pp_degree, vpp_degree, schedule_mode, seg_method: pipeline segmentation used by
            :meth:`complete` (see :meth:`complete_chunk_id`); layers_per_stage: layers per
            virtual stage in model order (None: an even split).
        max_sweeps: bound on propagation sweeps per phase.

    Raises (from the methods): CompletionError when nothing is annotated, a rule fails on
    an op (naming it), propagation does not converge, or the pipeline split is invalid.
    """

    def __init__(self, program: Program, zero_stage: int = 0, *, dp_mesh_dim: int | str | None = None,
                 pp_degree: int = 1, vpp_degree: int = 1, schedule_mode: str = "1F1B",
                 seg_method: str = DEFAULT_SEG_METHOD, max_sweeps: int = MAX_SWEEPS,
                 layers_per_stage: Sequence[int] | None = None) -> None:
        self.program = program
        self.zero_stage = zero_stage
        self.dp_mesh_dim = dp_mesh_dim
        self.pp_degree, self.vpp_degree = pp_degree, vpp_degree
        self.schedule_mode, self.seg_method = schedule_mode, seg_method
        self.max_sweeps = max_sweeps
        self.layers_per_stage = None if layers_per_stage is None else tuple(layers_per_stage)
        self.chunks: ChunkPlan | None = None
        self.op_mesh: dict[int, ProcessMesh] = {}
        self.fixed: dict[int, int] = {}
        self.fixed_ops: set[int] = set()
        self.sweeps: dict[str, int] = {}
        self._done: set[str] = set()
        self._prepared = False
        self._phases: tuple[int, dict[str, list[Operation]]] | None = None
        self._annotated: list[Value] = []  # the values fixed by _prepare, in definition order

    # -- public API ---------------------------------------------------------------------
    @gc_paused()  # builds a graph of cyclic Values/Operations (completion.gc_pause)
    def complete(self) -> Program:
        """Chunk ids (when pp_degree > 1), process meshes, forward, backward and update
        annotation. Returns the program (completed in place)."""
        if self.pp_degree > 1 or self.vpp_degree > 1:
            self.complete_chunk_id(self.pp_degree, self.vpp_degree, self.schedule_mode, self.seg_method)
        self.complete_forward_annotation()
        self.complete_backward_annotation()
        self.complete_update_annotation()
        return self.program

    def complete_chunk_id(self, pp_degree: int, vpp_degree: int = 1, schedule_mode: str = "1F1B",
                          seg_method: str = DEFAULT_SEG_METHOD) -> ChunkPlan:
        """Assign each op its pipeline stage and chunk (:mod:`completion.chunks`); sets
        ``op.chunk_id``. Later annotation completion places ops on their stage meshes (a
        completion already done is redone)."""
        self.chunks = assign_chunks(self.program, pp_degree, vpp_degree, schedule_mode, seg_method,
                                    self.layers_per_stage)
        self.pp_degree, self.vpp_degree = pp_degree, vpp_degree
        self._prepared = False
        self._done.clear()
        return self.chunks

    def complete_forward_annotation(self) -> None:
        """Complete forward and loss ops (and the sources they use first)."""
        self._run("forward")

    def complete_backward_annotation(self) -> None:
        """Complete backward ops (forward first if not done)."""
        if "forward" not in self._done:
            self._run("forward")
        self._run("backward")

    def complete_update_annotation(self, zero_stage: int | None = None) -> None:
        """Complete optimizer ops and their states; apply the ZeRO stage (argument, else
        the constructor's)."""
        for ph in ("forward", "backward"):
            if ph not in self._done:
                self._run(ph)
        self._run("update")
        stage = self.zero_stage if zero_stage is None else zero_stage
        ops = [op for op in self.program.ops if op.role == OpRole.OPTIMIZE]
        apply_zero(ops, stage, self.dp_mesh_dim, set(self.fixed))

    def stage_of(self, op: Operation) -> int:
        """The pipeline stage of ``op`` (0 without pipeline segmentation)."""
        return self.chunks.stage.get(id(op), 0) if self.chunks else 0

    # -- preparation --------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._prepared:
            return
        self._phases = None
        prog = self.program
        derived: set[Value] = getattr(prog, DERIVED_ATTR, set())
        derived_ops: set[Operation] = getattr(prog, DERIVED_OPS_ATTR, set())
        self.fixed, self.fixed_ops = {}, set()
        targets: list[Value] = []  # results that take a given reshard's target
        fixed = self.fixed
        annotated: list[Value] = []
        for op in prog.ops:  # one pass: an op's step touches only its own results
            if op.type == "reshard" and op.dist_attr is not None and op not in derived_ops:
                # a given reshard: its source and target are facts (module docstring)
                self.fixed_ops.add(id(op))
                for r, a in zip(op.results, op.dist_attr.results, strict=False):
                    if r is not None and a is not None and (r.dist_attr is None or r in derived):
                        r.dist_attr = a
                        derived.discard(r)
                        targets.append(r)
            else:
                op.dist_attr = None
            for v in op.results:  # every value, in definition order (Program.values, inlined)
                if v is None:
                    continue
                if v.dist_attr is not None and v not in derived:
                    fixed[id(v)] = 2 if v.is_parameter else 1
                    annotated.append(v)
                else:
                    v.dist_attr = None
        self._annotated = annotated
        # fixed now, but derived from their op: a later completion takes the op's target again
        setattr(prog, DERIVED_ATTR, set(targets))
        setattr(prog, DERIVED_OPS_ATTR, set())
        self._assign_meshes()
        self._prepared = True

    def _annotated_meshes(self) -> list[ProcessMesh]:
        """The meshes of the annotations, in the order their values are defined."""
        out: list[ProcessMesh] = []
        for v in self._annotated:  # the fixed values, as _prepare found them
            m = v.dist_attr.process_mesh  # type: ignore[union-attr]
            if m not in out:
                out.append(m)
        if not out:
            raise CompletionError("cannot complete: no value is annotated with a process mesh "
                                  "(annotate at least one value, e.g. a parameter)")
        return out

    def _assign_meshes(self) -> None:
        ops = self.program.ops
        meshes = self._annotated_meshes()
        if self.chunks is not None and self.chunks.pp_degree > 1:
            stages = stage_meshes(meshes[0], self.chunks.pp_degree)
            self.op_mesh = {id(op): stages[self.chunks.stage.get(id(op), 0)] for op in ops}
            self._rehome(stages)
            return
        fixed = self.fixed
        found: list[ProcessMesh | None] = []
        vmesh: dict[int, ProcessMesh] = {}
        for op in ops:  # plain loops: this runs once per op of the program
            m = None
            for r in op.results:
                if r is not None and id(r) in fixed and r.dist_attr is not None:
                    m = r.dist_attr.process_mesh
                    break
            if m is None:
                for v in op.operands:
                    if v is not None:
                        m = vmesh.get(id(v))
                        if m is not None:
                            break
            found.append(m)
            if m is not None:
                for r in op.results:
                    if r is not None:
                        vmesh[id(r)] = m
        nxt = next(m for m in found if m is not None)
        prev = None
        op_mesh, fixed_ops = self.op_mesh, self.fixed_ops
        for i, op in enumerate(ops):
            if found[i] is None:
                found[i] = prev or next((m for m in found[i:] if m is not None), nxt)
            prev = found[i]
            op_mesh[id(op)] = found[i]  # type: ignore[assignment]
            if id(op) in fixed_ops:  # a given reshard runs where it was given
                op_mesh[id(op)] = op.dist_attr.process_mesh  # type: ignore[union-attr]

    def _rehome(self, stages: list[ProcessMesh]) -> None:
        """Move annotations onto the stage mesh (and chunk) of the op that defines them."""
        for op in self.program.ops:
            mesh = self.op_mesh[id(op)]
            for r in op.results:
                if r is None or id(r) not in self.fixed or r.dist_attr is None:
                    continue
                a = r.dist_attr
                if a.process_mesh != mesh:
                    a = rehome(a, mesh)
                if a.chunk_id != op.chunk_id:
                    a = a.replace(chunk_id=op.chunk_id)
                r.dist_attr = a
            if id(op) in self.fixed_ops and op.dist_attr is not None:
                op.dist_attr = _rehome_op(op.dist_attr, mesh, op.chunk_id)

    # -- phases -------------------------------------------------------------------------
    def _phase_ops(self, phase: str) -> list[Operation]:
        """The ops of ``phase`` in program order (:meth:`_op_phases`: computed once per
        preparation and op count; completion itself inserts no op)."""
        if self._phases is None or self._phases[0] != len(self.program.ops):
            self._phases = (len(self.program.ops), self._op_phases())
        return self._phases[1][phase]

    def _op_phases(self) -> dict[str, list[Operation]]:
        """Per phase, its ops in program order. An op is in the phase of its own role,
        except a source (no operands, some results), which takes the role of its first
        user (forward when unused or first used by the loss)."""
        ops = self.program.ops
        pos = {id(op): i for i, op in enumerate(ops)}
        of_role = {role: name for name, roles in PHASES.items() for role in roles}
        out: dict[str, list[Operation]] = {name: [] for name in PHASES}
        for op in ops:
            role = op.role
            if not op.operands and op.results:
                first = -1
                for r in op.results:
                    if r is not None:
                        for u, _ in r.uses:
                            k = pos[id(u)]
                            if first < 0 or k < first:
                                first = k
                role = OpRole.FORWARD if first < 0 or ops[first].role == OpRole.LOSS else ops[first].role
            name = of_role.get(role)
            if name is not None:
                out[name].append(op)
        return out

    def _run(self, phase: str) -> None:
        self._prepare()
        ops = self._phase_ops(phase)
        prop = Propagator(ops, self.op_mesh, self.fixed, self.max_sweeps, self.fixed_ops)
        self.sweeps[phase] = prop.run()
        derived = getattr(self.program, DERIVED_ATTR)
        derived_ops = getattr(self.program, DERIVED_OPS_ATTR)
        fixed, fixed_ops = self.fixed, self.fixed_ops
        if fixed_ops:
            derived_ops.update(op for op in ops if id(op) not in fixed_ops)
        else:
            derived_ops.update(ops)
        for op in ops:
            for r in op.results:
                if r is not None and id(r) not in fixed:
                    if r.dist_attr is None:
                        r.dist_attr = TensorDistAttr.replicated(self.op_mesh[id(op)], r.ndim)
                    derived.add(r)
        self._done.add(phase)


def _rehome_op(da: OperatorDistAttr, mesh: ProcessMesh, chunk: int) -> OperatorDistAttr:
    """A given op dist attr moved onto its stage mesh (each attr as :func:`rehome`)."""

    def mv(a: TensorDistAttr | None) -> TensorDistAttr | None:
        if a is None:
            return None
        if a.process_mesh != mesh:
            a = rehome(a, mesh)
        return a if a.chunk_id == chunk else a.replace(chunk_id=chunk)

    return OperatorDistAttr(mesh, tuple(mv(a) for a in da.operands),
                            tuple(mv(a) for a in da.results), chunk)


def stage_meshes(mesh: ProcessMesh, pp_degree: int) -> list[ProcessMesh]:
    """The per-stage meshes for ``pp_degree`` stages (Completer docstring). Raises
    CompletionError if a ``pp`` mesh dim does not have ``pp_degree`` entries."""
    if "pp" in mesh.dim_names:
        d = mesh.dim_names.index("pp")
        if mesh.shape[d] != pp_degree:
            raise CompletionError(f"mesh dim 'pp' has size {mesh.shape[d]} but pp_degree is {pp_degree}")
        return [mesh.submesh(d, s) for s in range(pp_degree)]
    n = mesh.size
    return [ProcessMesh(mesh.shape, tuple(r + s * n for r in mesh.process_ids), mesh.dim_names)
            for s in range(pp_degree)]


def rehome(a: TensorDistAttr, mesh: ProcessMesh) -> TensorDistAttr:
    """``a`` moved onto the stage mesh ``mesh``: same dims_mapping when the shapes match;
    from a mesh with a ``pp`` dim, that dim dropped and later dims shifted down."""
    src = a.process_mesh
    if src.shape == mesh.shape:
        return TensorDistAttr(mesh, a.dims_mapping, a.partial_dims, a.chunk_id)
    if "pp" in src.dim_names and src.ndim == mesh.ndim + 1:
        d = src.dim_names.index("pp")

        def mv(m: int) -> int:
            return -1 if m < 0 or m == d else (m - 1 if m > d else m)

        part = {mv(m): t for m, t in a.partial if m != d}
        return TensorDistAttr(mesh, [mv(m) for m in a.dims_mapping], part, a.chunk_id)
    raise CompletionError(f"annotation on mesh {list(src.shape)} cannot move to stage mesh {list(mesh.shape)}")
