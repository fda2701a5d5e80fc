#!/usr/bin/env python3
"""anemone's package validator: checks a Core ML ML Program package (.mlpackage) with Apple's
coremltools, on any OS (Core ML itself is not needed and is never called).

    python tools/validate_mlpackage.py PKG.mlpackage [PKG …] [--strict] [-q]

Needs `pip install coremltools "numpy<2.4"` (no PyTorch); `scripts/test.sh` installs it into the
repository's `.venv`. Exit 0: valid; 1: invalid (every problem on stderr, naming the function, op
and value); 2: usage or environment problem. `--strict` also fails on warnings.

Checks, in order (a failed layout or parse stops that package):
  layout    Manifest.json (format 1.0.0, item entries, root model) and coremltools' own
            libmodelpackage view of it;
  proto     Data/com.apple.CoreML/model.mlmodel parses as an mlProgram model whose function
            opsets agree with its specification version;
  blobs     every weights/*.bin is MILBlob v2 (header, 0xDEADBEEF records, 64-byte alignment,
            in-bounds data), and every blobFileValue points at a record whose dtype and size match
            the declared tensor type;
  rebuild   coremltools' milproto frontend rebuilds the program, which re-creates every op with its
            opset's definition and re-runs type inference; every declared op output type must equal
            the inferred one; Program.validate();
  describe  the model description's inputs, outputs and states match each function's signature.
"""
import argparse
import json
import os
import struct
import sys

# MILBlob dtype codes and the proto DataType that declares each (coremltools' milproto helper).
BLOB_DTYPES = {1: ("fp16", 16), 2: ("fp32", 32), 3: ("uint8", 8), 4: ("int8", 8), 5: ("bf16", 16),
               6: ("int16", 16), 7: ("uint16", 16), 8: ("int4", 4), 9: ("uint1", 1), 10: ("uint2", 2),
               11: ("uint4", 4), 12: ("uint3", 3), 13: ("uint6", 6), 14: ("int32", 32),
               15: ("uint32", 32)}
PROTO_DTYPE_TO_BLOB = {10: "fp16", 11: "fp32", 13: "bf16", 21: "int8", 22: "int16", 23: "int32",
                       25: "int4", 31: "uint8", 32: "uint16", 33: "uint32", 35: "uint4",
                       36: "uint2", 37: "uint1", 38: "uint6", 39: "uint3"}
OPSET_OF_SPEC = {6: "CoreML5", 7: "CoreML6", 8: "CoreML7", 9: "CoreML8", 10: "CoreML9"}
BLOB_SENTINEL = 0xDEADBEEF


class Report:
    def __init__(self, package):
        self.package, self.errors, self.warnings = package, [], []

    def error(self, message):
        self.errors.append(message)

    def warn(self, message):
        self.warnings.append(message)


class Stop(Exception):
    """A problem after which the remaining checks of one package cannot run."""


def check_layout(pkg, report):
    manifest_path = os.path.join(pkg, "Manifest.json")
    if not os.path.isdir(pkg):
        raise Stop("not a directory (an .mlpackage is a directory)")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise Stop(f"Manifest.json: {e}")
    if manifest.get("fileFormatVersion") != "1.0.0":
        report.error(f"Manifest.json: fileFormatVersion {manifest.get('fileFormatVersion')!r}, expected '1.0.0'")
    entries = manifest.get("itemInfoEntries") or {}
    root_id = manifest.get("rootModelIdentifier")
    if root_id not in entries:
        raise Stop(f"Manifest.json: rootModelIdentifier {root_id!r} names no item entry")
    for ident, entry in entries.items():
        missing = [k for k in ("path", "name", "author", "description") if k not in entry]
        if missing:
            report.error(f"Manifest.json: item {ident} lacks {missing}")
        if not os.path.exists(os.path.join(pkg, "Data", entry.get("path", ""))):
            report.error(f"Manifest.json: item {ident}: Data/{entry.get('path')} does not exist")
    model_path = os.path.join(pkg, "Data", entries[root_id].get("path", ""))
    if not os.path.isfile(model_path):
        raise Stop(f"root model Data/{entries[root_id].get('path')} is not a file")
    from coremltools.libmodelpackage import ModelPackage
    if not ModelPackage.isValid(pkg):
        report.error("coremltools' libmodelpackage says the package is not valid")
    elif os.path.realpath(ModelPackage(pkg).getRootModel().path()) != os.path.realpath(model_path):
        report.error("libmodelpackage's root model is not the one Manifest.json names")
    weights = [e["path"] for e in entries.values() if e.get("name") == "weights" and "path" in e]
    weights_dir = os.path.join(pkg, "Data", weights[0]) if weights else os.path.join(os.path.dirname(model_path), "weights")
    return model_path, weights_dir


def read_spec(model_path, report):
    from coremltools.proto import Model_pb2
    spec = Model_pb2.Model()
    try:
        with open(model_path, "rb") as f:
            spec.ParseFromString(f.read())
    except Exception as e:  # protobuf raises its own DecodeError
        raise Stop(f"model.mlmodel does not parse: {e}")
    if spec.WhichOneof("Type") != "mlProgram":
        raise Stop(f"model.mlmodel holds a {spec.WhichOneof('Type')}, not an mlProgram")
    expected = OPSET_OF_SPEC.get(spec.specificationVersion)
    if expected is None:
        report.error(f"unknown specificationVersion {spec.specificationVersion}")
    for name, function in spec.mlProgram.functions.items():
        if expected and function.opset != expected:
            report.error(f"function {name}: opset {function.opset} but specificationVersion "
                         f"{spec.specificationVersion} means {expected}")
    return spec


def blob_records(path, report):
    """{record offset: (dtype name, bit width, data bytes, padding bits)} of one weight file."""
    name, size, records = os.path.basename(path), os.path.getsize(path), {}
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64:
            report.error(f"{name}: shorter than its 64-byte header")
            return records
        count, version = struct.unpack_from("<II", header)
        if version != 2:
            report.error(f"{name}: header version {version}, expected 2")
            return records
        offset = 64
        for index in range(count):
            f.seek(offset)
            record = f.read(64)
            if len(record) < 64:
                report.error(f"{name}: the header counts {count} blobs, record {index} at {offset} is past the end")
                break
            sentinel, code, nbytes, data_offset, padding = struct.unpack_from("<IIQQQ", record)
            if sentinel != BLOB_SENTINEL:
                report.error(f"{name}: record {index} at {offset}: sentinel 0x{sentinel:08X}")
                break
            if code not in BLOB_DTYPES:
                report.error(f"{name}: record {index} at {offset}: unknown dtype code {code}")
            if data_offset % 64 or data_offset < offset + 64:
                report.error(f"{name}: record {index}: data offset {data_offset} misplaced or unaligned")
            if data_offset + nbytes > size:
                report.error(f"{name}: record {index}: data runs past the end of the file")
            if padding >= 8:
                report.error(f"{name}: record {index}: padding of {padding} bits")
            dtype, bits = BLOB_DTYPES.get(code, (f"code {code}", 0))
            records[offset] = (dtype, bits, nbytes, padding)
            offset = data_offset + nbytes
            offset += (-offset) % 64
    return records


def blob_values(block):
    """(op index, op, role, value) of every immediate value bound in a block, recursively."""
    for index, op in enumerate(block.operations):
        for key, value in op.attributes.items():
            yield index, op, f"attribute {key}", value
        for key, argument in op.inputs.items():
            for binding in argument.arguments:
                if binding.WhichOneof("binding") == "value":
                    yield index, op, f"input {key}", binding.value
        for nested in op.blocks:
            yield from blob_values(nested)


def op_label(op):
    name = op.attributes["name"].immediateValue.tensor.strings.values[0] if "name" in op.attributes else "?"
    return f"{op.type} `{name}`"


def check_blobs(spec, weights_dir, report):
    files = {}
    for fname, function in spec.mlProgram.functions.items():
        for block in function.block_specializations.values():
            for index, op, role, value in blob_values(block):
                if value.WhichOneof("value") != "blobFileValue":
                    continue
                where = f"function {fname}, op #{index} {op_label(op)}, {role}"
                blob = value.blobFileValue
                if not blob.fileName.startswith("@model_path/weights/"):
                    report.error(f"{where}: blob file {blob.fileName!r} is outside @model_path/weights/")
                    continue
                path = os.path.join(weights_dir, blob.fileName.rsplit("/", 1)[-1])
                if not os.path.isfile(path):
                    report.error(f"{where}: weight file {path} is missing")
                    continue
                if path not in files:
                    files[path] = blob_records(path, report)
                record = files[path].get(blob.offset)
                if record is None:
                    report.error(f"{where}: offset {blob.offset} is not a blob record of {os.path.basename(path)}")
                    continue
                tensor = value.type.tensorType
                declared = PROTO_DTYPE_TO_BLOB.get(tensor.dataType)
                dtype, bits, nbytes, padding = record
                if declared != dtype:
                    report.error(f"{where}: the blob holds {dtype}, the value declares {declared}")
                    continue
                if any(d.WhichOneof("dimension") != "constant" for d in tensor.dimensions):
                    report.error(f"{where}: a blob value needs a static shape")
                    continue
                count = 1
                for d in tensor.dimensions:
                    count *= d.constant.size
                need_bits = count * bits
                if nbytes != (need_bits + 7) // 8 or (bits < 8 and padding != (-need_bits) % 8):
                    report.error(f"{where}: blob of {nbytes} bytes (+{padding} padding bits) "
                                 f"for {count} {dtype} values")


def type_text(t):
    from coremltools.converters.mil.mil import types
    if types.is_tensor(t):
        return f"tensor<{types.builtin_to_string(t.get_primitive())}, {list(t.get_shape())}>"
    return types.builtin_to_string(t)


def compare_types(where, declared, inferred, report):
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.types.symbolic import is_symbolic
    if types.is_state(declared) or types.is_state(inferred):
        return
    primitive = lambda t: t.get_primitive() if types.is_tensor(t) else t
    shape = lambda t: list(t.get_shape()) if types.is_tensor(t) else []
    if primitive(declared) != primitive(inferred) or len(shape(declared)) != len(shape(inferred)):
        report.error(f"{where}: declared {type_text(declared)}, inferred {type_text(inferred)}")
        return
    for axis, (a, b) in enumerate(zip(shape(declared), shape(inferred))):
        if is_symbolic(a) or is_symbolic(b):
            if is_symbolic(a) != is_symbolic(b):
                report.error(f"{where}: axis {axis}: declared {a}, inferred {b} (static vs dynamic)")
        elif int(a) != int(b):
            report.error(f"{where}: axis {axis}: declared {a}, inferred {b}")


def rebuild(spec, weights_dir, report):
    from coremltools.converters.mil.frontend.milproto import load as milproto
    from coremltools.converters.mil.frontend.milproto.helper import proto_to_types
    try:
        program = milproto.load(spec, spec.specificationVersion, weights_dir)
    except Exception as e:  # coremltools raises many kinds; each names the op
        raise Stop(f"coremltools could not rebuild the program: {type(e).__name__}: {e}")
    try:
        program.validate()
    except Exception as e:
        report.error(f"coremltools' Program.validate(): {type(e).__name__}: {e}")
    for fname, fspec in spec.mlProgram.functions.items():
        function = program.functions[fname]
        variables = dict(function.inputs)
        collect_outputs(function, variables)
        for index, op in enumerate(fspec.block_specializations[fspec.opset].operations):
            for output in op.outputs:
                var = variables.get(output.name)
                if var is not None:
                    compare_types(f"function {fname}, op #{index} {op_label(op)}, output {output.name}",
                                  proto_to_types(output.type), var.sym_type, report)
    return program


def collect_outputs(block, variables):
    for op in block.operations:
        for var in op.outputs:
            variables[var.name] = var
        for nested in op.blocks:
            collect_outputs(nested, variables)


def check_description(spec, program, report):
    from coremltools.converters.mil.mil import types
    description = spec.description
    if description.functions:
        described = {f.name: f for f in description.functions}
    else:
        described = {description.defaultFunctionName or "main": description}
    if set(described) != set(program.functions):
        report.error(f"the description lists functions {sorted(described)}, the program defines {sorted(program.functions)}")
    for fname, fdesc in described.items():
        if fname not in program.functions:
            continue
        function = program.functions[fname]
        inputs = sorted(k for k, v in function.inputs.items() if not types.is_state(v.sym_type))
        states = sorted(k for k, v in function.inputs.items() if types.is_state(v.sym_type))
        outputs = sorted(v.name for v in function.outputs)
        for kind, listed, actual in (("inputs", fdesc.input, inputs), ("states", fdesc.state, states),
                                     ("outputs", fdesc.output, outputs)):
            names = sorted(f.name for f in listed)
            if names != actual:
                report.error(f"function {fname}: the description's {kind} {names} are not the program's {actual}")
        if states and spec.specificationVersion < 9:
            report.error(f"function {fname}: states need specificationVersion 9, the model has {spec.specificationVersion}")
        for state in fdesc.state:
            var = function.inputs.get(state.name)
            if var is None:
                continue
            wrapped = var.sym_type.wrapped_type()
            shape = [int(s) for s in wrapped.get_shape()]
            if list(state.type.stateType.arrayType.shape) != shape:
                report.error(f"function {fname}: state {state.name}: described shape "
                             f"{list(state.type.stateType.arrayType.shape)}, program {shape}")


def validate(pkg):
    report = Report(pkg)
    try:
        model_path, weights_dir = check_layout(pkg, report)
        spec = read_spec(model_path, report)
        check_blobs(spec, weights_dir, report)
        program = rebuild(spec, weights_dir, report)
        check_description(spec, program, report)
    except Stop as stop:
        report.error(str(stop))
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="+", metavar="PKG")
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing when valid")
    args = parser.parse_args()
    try:
        import coremltools  # noqa: F401
    except ImportError as e:
        print(f"validate_mlpackage: cannot import coremltools ({e}); "
              "install it with: pip install coremltools \"numpy<2.4\"", file=sys.stderr)
        return 2
    failed = False
    for pkg in args.packages:
        report = validate(pkg)
        for w in report.warnings:
            print(f"{pkg}: WARNING: {w}", file=sys.stderr)
        for e in report.errors:
            print(f"{pkg}: ERROR: {e}", file=sys.stderr)
        bad = report.errors or (args.strict and report.warnings)
        failed = failed or bool(bad)
        if bad:
            print(f"{pkg}: INVALID: {len(report.errors)} error(s), {len(report.warnings)} warning(s)", file=sys.stderr)
        elif not args.quiet:
            print(f"{pkg}: VALID ({len(report.warnings)} warning(s))")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
