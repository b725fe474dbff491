"""Regenerate iterreduce_pb2.py and iterreduce_pb2_grpc.py from iterreduce.proto.

    pip install grpcio-tools && python -m iterreduce.proto.generate

Run from anywhere; the generated modules import each other as ``iterreduce.proto``.
"""

from pathlib import Path


def main() -> int:
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[2]
    proto = "iterreduce/proto/iterreduce.proto"
    return protoc.main([
        "grpc_tools.protoc", f"-I{root}", f"--python_out={root}", f"--grpc_python_out={root}",
        f"--pyi_out={root}", str(root / proto),
    ])


if __name__ == "__main__":
    raise SystemExit(main())
