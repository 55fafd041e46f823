"""``inference.GRPCInferenceService`` on grpc.aio (triton_spec §6, §2.6, §7).

Built on the generated modules that ship with ``tritonclient`` (``service_pb2``,
``service_pb2_grpc``, ``model_config_pb2``), so the server and every client share one copy of
Triton's protobuf descriptors. Every RPC maps ``ServerError`` codes to gRPC status codes exactly
as Triton does. System shared memory is served from the core's registry (the same regions as
over HTTP); CUDA shared memory answers as a Triton that cannot open CUDA handles; the optional
trace and logging extensions answer UNIMPLEMENTED. ``grpc.health.v1.Health/Check`` is served when the
``grpcio-health-checking`` package is installed.

The listener speaks TLS (mutual or not) when given a
:class:`~reference_server.frontends.tls.GrpcTls`, and refuses calls of restricted groups without
their metadata key (:mod:`reference_server.frontends.restricted`), both as Triton does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from reference_server.batching.sequence import SequenceInfo, set_sequence
from reference_server.core.errors import Code, DecoupledRefusal, ServerError
from reference_server.core.shm import SharedMemoryRegistry
from reference_server.core.types import InferRequest, InferResponse, ParamValue, RequestedOutput
from reference_server.frontends import wire
from reference_server.frontends.restricted import (
    GRPC_METHOD_GROUPS,
    Restriction,
    Restrictions,
    grpc_allows,
    grpc_refusal,
)

if TYPE_CHECKING:
    from reference_server.core.server import InferenceServer
    from reference_server.frontends.tls import GrpcTls

logger = logging.getLogger(__name__)

#: Triton's limit on both directions (INT32_MAX); grpc's own default is 4 MiB.
MAX_MESSAGE_SIZE = 2**31 - 1

#: What a request that is not valid protobuf deserializes to (grpc's own answer would be
#: ``UNKNOWN: Unexpected <class 'google.protobuf.message.DecodeError'>``).
_UNPARSABLE = object()
_UNPARSABLE_MESSAGE = "failed to parse the request: not a valid protobuf message for this RPC"

STATUS_CODES: dict[Code, grpc.StatusCode] = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}

# Typed ``contents`` field that carries each datatype (8/16-bit values ride in 32-bit fields).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The datatype Triton names for data found in a contents field of the wrong type.
_FIELD_DATATYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_IGNORED_PARAMETERS = frozenset({"binary_data_output"})
_ALLOWED_TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})

R = TypeVar("R")
Rpc = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]


def _rpc(method: Rpc[R]) -> Rpc[R]:
    """Translate ServerError (and any bug) into a gRPC status instead of a crashed call."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            if request is _UNPARSABLE:
                raise ServerError(_UNPARSABLE_MESSAGE, Code.INTERNAL)  # Triton 2.51: INTERNAL
            return await method(self, request, context)
        except ServerError as exc:
            await context.abort(STATUS_CODES[exc.code], exc.message)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            logger.exception("unhandled error in gRPC %s", method.__name__)
            # Nothing of the exception goes to the client (it may name files or internals).
            await context.abort(
                grpc.StatusCode.INTERNAL,
                "internal server error; the reference server's log has details",
            )
        raise AssertionError("context.abort returned")  # pragma: no cover

    return wrapper


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 gRPC service over one :class:`~reference_server.core.server.InferenceServer`."""

    def __init__(self, core: InferenceServer) -> None:
        self._core = core

    # -- health and metadata ------------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self._core.is_live())

    @_rpc
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._core.is_ready())

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self._core.model_ready(request.name, request.version))

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(
            self._core.server_metadata(), pb.ServerMetadataResponse(), ignore_unknown_fields=True
        )

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        metadata = self._core.model_metadata(request.name, request.version)
        return json_format.ParseDict(
            metadata, pb.ModelMetadataResponse(), ignore_unknown_fields=True
        )

    @_rpc
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = self._core.model_config(request.name, request.version)
        return pb.ModelConfigResponse(config=config)

    @_rpc
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = self._core.model_statistics(request.name, request.version)
        return json_format.ParseDict(
            stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    # -- repository extension -----------------------------------------------------------------

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        index = self._core.repository_index(ready_only=request.ready)
        return json_format.ParseDict(
            {"models": index}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True
        )

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        if request.repository_name:
            raise ServerError("'repository_name' specification is not supported", Code.UNSUPPORTED)
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            kind = param.WhichOneof("parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise ServerError(
                        "invalid value type for load parameter 'config', expected string_param.",
                        Code.INVALID_ARG,
                    )
                config = param.string_param
            elif key.startswith("file:"):
                if kind != "bytes_param":
                    raise ServerError(
                        f"invalid value type for load parameter '{key}', expected bytes_param.",
                        Code.INVALID_ARG,
                    )
                files[key] = param.bytes_param
            else:
                raise ServerError(f"unrecognized load parameter '{key}'.", Code.INVALID_ARG)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, self._core.load_model, request.model_name, config, files or None
        )
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        if request.repository_name:
            raise ServerError("'repository_name' specification is not supported", Code.UNSUPPORTED)
        dependents = False
        for key, param in request.parameters.items():
            if key != "unload_dependents" or param.WhichOneof("parameter_choice") != "bool_param":
                raise ServerError(f"unrecognized unload parameter '{key}'.", Code.INVALID_ARG)
            dependents = param.bool_param
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._core.unload_model, request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- inference ----------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._infer(request)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """Bidirectional stream: requests run concurrently, responses go out as they finish.

        An error answers that request with ``error_message`` and leaves the stream open.
        """
        results: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def run_one(message: Any) -> None:
            try:
                await self._stream_one(message, results)
            except ServerError as exc:
                await results.put(
                    pb.ModelStreamInferResponse(
                        error_message=exc.message,
                        infer_response=pb.ModelInferResponse(
                            model_name=message.model_name,
                            model_version=message.model_version,
                            id=message.id,
                        ),
                    )
                )
            except Exception:  # keep the stream alive for the other requests
                logger.exception("unhandled error in ModelStreamInfer")
                await results.put(
                    pb.ModelStreamInferResponse(
                        error_message="internal server error; the reference server's log has "
                        "details"
                    )
                )

        async def read_all() -> None:
            try:
                async for message in request_iterator:
                    if message is _UNPARSABLE:
                        await results.put(
                            pb.ModelStreamInferResponse(error_message=_UNPARSABLE_MESSAGE)
                        )
                        continue
                    task = asyncio.create_task(run_one(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(set(running))
            finally:
                # Also when reading fails: the writer below must not wait forever.
                results.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await results.get()) is not None:
                yield item
        finally:
            # Client gone or stream closed: cancelling marks queued requests cancelled.
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _infer(self, message: Any) -> Any:
        request = to_infer_request(message, self._core.shared_memory)
        try:
            response = await self._core.infer(request)
        except asyncio.CancelledError:
            # The RPC was cancelled (client deadline or disconnect): let the batcher drop it.
            request.cancel()
            raise
        except DecoupledRefusal:
            raise ServerError(
                "ModelInfer RPC doesn't support models with decoupled transaction policy",
                Code.UNSUPPORTED,
            ) from None
        return to_infer_response(response, request)

    async def _stream_one(self, message: Any, results: asyncio.Queue[Any]) -> None:
        """Every response of one stream request, each carrying ``triton_final_response`` (true
        on the last; a model that is not decoupled sends one, flagged true), as Triton 2.51
        marks them."""
        request = to_infer_request(message, self._core.shared_memory)
        async for response in self._core.infer_stream(request):
            response.parameters["triton_final_response"] = response.final
            await results.put(
                pb.ModelStreamInferResponse(infer_response=to_infer_response(response, request))
            )

    # -- shared-memory extensions -------------------------------------------------------------

    @_rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        reply = pb.SystemSharedMemoryStatusResponse()
        for region in self._core.shared_memory.status(request.name):
            entry = reply.regions[region.name]
            entry.name = region.name
            entry.key = region.key
            entry.offset = region.offset
            entry.byte_size = region.byte_size
        return reply

    @_rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self._core.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self._core.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        self._core.shared_memory.cuda_status(request.name)  # none to list; a name raises
        return pb.CudaSharedMemoryStatusResponse()

    @_rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self._core.shared_memory.cuda_register(request.name)
        raise AssertionError("cuda_register always raises")  # pragma: no cover

    @_rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        # No CUDA region is ever registered; Triton answers OK for any name.
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- optional extensions this server does not implement -----------------------------------

    async def _unsupported(self, context: Any, what: str) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by the reference server"
        )

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        return await self._unsupported(context, "the trace extension")

    async def LogSettings(self, request: Any, context: Any) -> Any:
        return await self._unsupported(context, "the logging extension")


def to_infer_request(
    message: Any, shared_memory: SharedMemoryRegistry | None = None
) -> InferRequest:
    """Build the core request from a ``ModelInferRequest`` (raw, typed or shared-memory data).

    ``shared_memory`` holds the regions inputs and outputs may name (``None``: none is known).

    Raises:
        ServerError: INVALID_ARG with Triton's message for inconsistent tensors or parameters.
    """
    request = InferRequest(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    _parse_parameters(request, message.parameters)
    raw = message.raw_input_contents
    raw_index = 0  # raw entries belong to the inputs without shared memory, in order
    for tensor in message.inputs:
        name = tensor.name
        datatype = tensor.datatype
        shape = list(tensor.shape)
        if datatype not in wire.NUMPY_DTYPES:
            raise ServerError(
                f"{wire.request_prefix(request)}inference input '{name}' data-type is '{datatype}', which "
                "is not a KServe datatype",
                Code.INVALID_ARG,
            )
        if any(dim < 0 for dim in shape):
            raise ServerError(
                f"{wire.request_prefix(request)}All input dimensions should be specified for input "
                f"'{name}' for model '{request.model_name}', got {shape}",
                Code.INVALID_ARG,
            )
        shm = _shm_reference(tensor)
        if shm is not None:
            if tensor.HasField("contents"):
                raise ServerError(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{request.model_name}'",
                    Code.INVALID_ARG,
                )
            try:
                array = wire.shm_input(shared_memory, shm, datatype, shape)
            except ValueError as exc:
                raise wire.size_mismatch(request, name, exc) from None
        elif tensor.HasField("contents"):
            if raw:
                raise ServerError(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{request.model_name}'",
                    Code.INVALID_ARG,
                )
            array = _from_contents(request, name, datatype, shape, tensor.contents)
        elif raw_index < len(raw):
            raw_index += 1
            try:
                array = wire.from_raw(datatype, shape, raw[raw_index - 1])
            except ValueError as exc:
                raise wire.size_mismatch(request, name, exc) from None
        elif wire.element_count(shape) == 0:
            array = np.empty(shape, dtype=wire.NUMPY_DTYPES[datatype])
        else:
            raise ServerError(
                f"unable to find data for input tensor '{name}' for model "
                f"'{request.model_name}' in request.",
                Code.INVALID_ARG,
            )
        request.inputs[name] = array
        request.input_datatypes[name] = datatype
    for output in message.outputs:
        shm = _shm_reference(output)
        if shm is not None:
            if "classification" in output.parameters:
                raise ServerError(
                    "output can't set both 'shared_memory_region' and 'classification'",
                    Code.INVALID_ARG,
                )
            target = wire.shm_output(shared_memory, shm)
            request.requested_outputs.append(
                RequestedOutput(name=output.name, shared_memory=target)
            )
            continue
        class_count = 0
        if "classification" in output.parameters:
            class_count = int(_param_value(output.parameters["classification"]) or 0)
        request.requested_outputs.append(RequestedOutput(name=output.name, class_count=class_count))
    return request


def _shm_reference(tensor: Any) -> wire.ShmReference | None:
    """A tensor's shared-memory parameters with Triton's gRPC rules (int64 offset and size)."""
    params = tensor.parameters
    name = tensor.name
    region: str | None = None
    if "shared_memory_region" in params:
        param = params["shared_memory_region"]
        if param.WhichOneof("parameter_choice") != "string_param":
            raise _shm_type("shared_memory_region", name, "string_param")
        region = param.string_param
    values = {}
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key not in params:
            continue
        if region is None:
            raise ServerError(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for "
                f"tensor '{name}'",
                Code.INVALID_ARG,
            )
        param = params[key]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise _shm_type(key, name, "int64_param")
        values[key] = param.int64_param
    if region is None:
        return None
    if "shared_memory_byte_size" not in values:
        raise ServerError(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            f"parameter for tensor '{name}'",
            Code.INVALID_ARG,
        )
    return wire.ShmReference(
        region=region,
        offset=values.get("shared_memory_offset", 0),
        byte_size=values["shared_memory_byte_size"],
    )


def _shm_type(key: str, tensor: str, expected: str) -> ServerError:
    return ServerError(
        f"invalid value type for '{key}' parameter for tensor '{tensor}', expected {expected}.",
        Code.INVALID_ARG,
    )


def _from_contents(
    request: InferRequest, name: str, datatype: str, shape: list[int], contents: Any
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ServerError(
            f"{wire.request_prefix(request)}{datatype} input '{name}' cannot be sent in typed contents; "
            "use raw_input_contents",
            Code.INVALID_ARG,
        )
    for descriptor, _ in contents.ListFields():
        if descriptor.name != field:
            raise ServerError(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{request.model_name}' of type '{_FIELD_DATATYPE[descriptor.name]}', "
                f"expected datatype '{datatype}'",
                Code.INVALID_ARG,
            )
    values = getattr(contents, field)
    count = wire.element_count(shape)
    if len(values) != count:
        # Triton turns typed contents into bytes first, so a wrong count is a byte-size error.
        itemsize = wire.NUMPY_DTYPES[datatype].itemsize
        expected, got = (
            (count, len(values))
            if datatype == "BYTES"
            else (
                count * itemsize,
                len(values) * itemsize,
            )
        )
        raise wire.size_mismatch(request, name, f"Expected {expected}, got {got}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = wire.NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and dtype.itemsize < 4:
        # 8/16-bit values arrive widened to 32 bits; narrowing wraps like a C cast.
        wide = np.array(values, dtype=np.int64 if dtype.kind == "i" else np.uint64)
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


def _parse_parameters(request: InferRequest, parameters: Any) -> None:
    sequence: dict[str, Any] = {}
    for key, param in parameters.items():
        kind = param.WhichOneof("parameter_choice")
        if key.startswith("triton_") and key not in _ALLOWED_TRITON_PARAMETERS:
            raise ServerError(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                "the following keys starting with 'triton_' are allowed: "
                + ", ".join(sorted(_ALLOWED_TRITON_PARAMETERS)),
                Code.INVALID_ARG,
            )
        if key == "sequence_id":
            if kind not in ("int64_param", "uint64_param", "string_param"):
                raise ServerError(
                    "invalid value type for 'sequence_id' parameter, expected int64_param, "
                    "uint64_param or string_param.",
                    Code.INVALID_ARG,
                )
            value = getattr(param, kind)
            # tritonclient sends an int id as int64_param; Triton reads it as a uint64.
            sequence["correlation_id"] = value if isinstance(value, str) else int(value) % 2**64
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise ServerError(
                    f"invalid value type for '{key}' parameter, expected bool_param.",
                    Code.INVALID_ARG,
                )
            sequence[key.removeprefix("sequence_")] = bool(param.bool_param)
        elif key == "priority":
            if kind not in ("int64_param", "uint64_param"):
                raise ServerError(
                    "invalid value type for 'priority' parameter, expected int64_param or "
                    "uint64_param.",
                    Code.INVALID_ARG,
                )
            if kind == "int64_param" and param.int64_param < 0:
                raise ServerError(
                    "invalid value for 'priority', expected value >= 0.", Code.INVALID_ARG
                )
            request.priority = int(getattr(param, kind))
        elif key == "timeout":
            if kind != "int64_param":
                raise ServerError(
                    "invalid value type for 'timeout' parameter, expected int64_param.",
                    Code.INVALID_ARG,
                )
            # Triton accepts a negative timeout; it cannot mean anything but "none".
            request.timeout_us = max(0, param.int64_param)
        elif key in _IGNORED_PARAMETERS or key in _ALLOWED_TRITON_PARAMETERS:
            continue
        elif kind is not None:
            request.parameters[key] = _param_value(param)
    if sequence:
        set_sequence(request, SequenceInfo(**sequence))


def _param_value(param: Any) -> ParamValue:
    kind = param.WhichOneof("parameter_choice")
    value: ParamValue = getattr(param, kind) if kind else ""
    return value


def to_infer_response(response: InferResponse, request: InferRequest | None = None) -> Any:
    """Render a core response as ``ModelInferResponse`` (one raw entry per output, in order).

    An output the request directs to shared memory is written there; its raw entry is empty,
    as in Triton's reply.
    """
    targets = {
        output.name: output.shared_memory
        for output in (request.requested_outputs if request is not None else ())
        if output.shared_memory is not None
    }
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        _set_param(message.parameters[key], value)
    for name, array in response.outputs.items():
        datatype = response.output_datatypes[name]
        tensor = message.outputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(array.shape)
        target = targets.get(name)
        if target is not None:
            wire.write_shm_output(name, datatype, array, target)
            message.raw_output_contents.append(b"")
        else:
            message.raw_output_contents.append(bytes(wire.to_raw(datatype, array)))
    return message


def _set_param(param: Any, value: Any) -> None:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


class GrpcFrontend:
    """Owns the grpc.aio server: the inference service and (if available) grpc.health.v1.

    Args:
        core: The server facade shared with the HTTP frontend.
        tls: Serve TLS with this material (``None``: plain text).
        restrictions: ``--grpc-restricted-protocol``: the groups refused without their key.
    """

    def __init__(
        self,
        core: InferenceServer,
        *,
        tls: GrpcTls | None = None,
        restrictions: Restrictions | None = None,
    ) -> None:
        self._core = core
        self._tls = tls
        self._restrictions = restrictions or Restrictions()
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = a free port) and return the bound port.

        Raises:
            OSError: The address cannot be bound (typically: the port is in use).
        """
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
                ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
                # grpc enables SO_REUSEPORT by default on Linux, which would let two servers
                # silently share a port; a busy port must fail loudly instead.
                ("grpc.so_reuseport", 0),
            ]
        )
        _add_service(server, InferenceServicer(self._core), self._restrictions)
        _add_health_service(server, self._core, self._restrictions.get("health"))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self._tls is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, self._tls.server_credentials())
        except RuntimeError as exc:
            raise OSError(98, f"cannot bind gRPC port {address}: {exc}") from exc
        if bound == 0:  # older grpc versions report a failed bind as port 0
            raise OSError(98, f"cannot bind gRPC port {address}")
        await server.start()
        self._server = server
        return bound

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting calls; in-flight calls get ``grace_s`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None


class _Handlers:
    """Stands in for the server while the generated code registers its method handlers."""

    service = ""
    handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # rebuilt from the registered handlers below

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.service, self.handlers = service, dict(handlers)


def _add_service(
    server: grpc.aio.Server, servicer: InferenceServicer, restrictions: Restrictions
) -> None:
    """Register the generated service with request decoding that never raises.

    A request that is not valid protobuf decodes to a marker the servicer answers with
    INTERNAL (as Triton 2.51) and a plain message, instead of grpc's text naming a Python class.
    Methods of a restricted group check the call's metadata first.
    """
    capture = _Handlers()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)
    handlers = {}
    for name, handler in capture.handlers.items():
        handler = handler._replace(request_deserializer=_lenient(handler.request_deserializer))
        restriction = restrictions.get(GRPC_METHOD_GROUPS.get(f"/{capture.service}/{name}"))
        handlers[name] = handler if restriction is None else _restricted(handler, restriction)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.service, handlers),)
    )
    server.add_registered_method_handlers(capture.service, handlers)


def _restricted(handler: grpc.RpcMethodHandler, restriction: Restriction) -> grpc.RpcMethodHandler:
    """``handler`` behind Triton's check: no matching metadata, the call ends UNAVAILABLE.

    A stream is ended before any of its messages is read, as Triton does.
    """
    details = grpc_refusal(restriction)

    async def refuse_unless_allowed(context: grpc.aio.ServicerContext) -> None:
        if not grpc_allows(restriction, context.invocation_metadata() or ()):
            await context.abort(grpc.StatusCode.UNAVAILABLE, details)

    if handler.request_streaming and handler.response_streaming:
        stream = handler.stream_stream

        async def checked_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await refuse_unless_allowed(context)
            async for response in stream(requests, context):
                yield response

        return handler._replace(stream_stream=checked_stream)
    if handler.request_streaming or handler.response_streaming:
        raise TypeError("the inference service has no half-streaming methods")
    unary = handler.unary_unary

    async def checked_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse_unless_allowed(context)
        return await unary(request, context)

    return handler._replace(unary_unary=checked_unary)


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:
            return _UNPARSABLE

    return decode


def _add_health_service(
    server: grpc.aio.Server, core: InferenceServer, restriction: Restriction | None
) -> bool:
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:  # optional: pip install grpcio-health-checking
        return False

    class HealthServicer(health_pb2_grpc.HealthServicer):
        """SERVING iff the server is ready (triton_spec §6), asked fresh on every check."""

        async def Check(self, request: Any, context: Any) -> Any:
            # Triton restricts Check with the health group.
            if restriction is not None and not grpc_allows(
                restriction, context.invocation_metadata() or ()
            ):
                await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(restriction))
            serving = core.is_ready()
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if serving
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            return health_pb2.HealthCheckResponse(status=status)

        async def Watch(self, request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not supported")

    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    return True
