"""Prints the stack samples of a Perfetto trace as JSON, read with Perfetto's own compiled
schema (its Python package), not fsprof's writer: one object per sample with its time,
thread, counter (name, unit), weight and frames (bottom first, as [function, file])."""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

trace = pb.Trace()
with open(sys.argv[1], "rb") as f:
    trace.ParseFromString(f.read())
samples = []
for p in trace.packet:
    if not p.HasField("stack_sample"):
        continue
    s = p.stack_sample
    samples.append({
        "ts": p.timestamp,
        "pid": s.task_context.pid,
        "tid": s.task_context.tid,
        "counter": s.primary_descriptor.name,
        "unit": pb.StackSample.Unit.Name(s.primary_descriptor.unit),
        "weight": s.primary_weight,
        "frames": [[f.function_name, f.source_file] for f in s.callstack.frames],
    })
json.dump(samples, sys.stdout)
