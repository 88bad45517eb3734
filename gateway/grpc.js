// The model of a gRPC request, read where nginx alone cannot see it: inside the body.
//
// ModelInfer, ModelReady and ModelMetadata each name their model in field 1 of their message
// (model_name / name), which every protobuf encoder writes first. nginx buffers the body whole
// (client_body_buffer_size = client_max_body_size in that location), this script reads the
// field from the first gRPC message, and sends the request on by an internal redirect, which
// keeps the buffered body for grpc_pass:
//   @grpc_infer   a served model's ModelInfer: the tenant's and the model's buckets, then Triton
//   @grpc_model   a served model's readiness or metadata: straight to Triton
//   @grpc_refused anything else, with $grpc_refusal_status and $grpc_refusal_message
// gateway/nginx.py renders the locations and sets $grpc_models (the served models,
// space-separated).

// grpc-status codes.
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;
const RESOURCE_EXHAUSTED = 8;

// The first length-delimited field 1 of the first message, or null if it is not there.
function modelName(body) {
    // A gRPC message: 1 byte "compressed", 4 bytes big-endian length, the protobuf.
    if (body.length < 7 || body[0] !== 0) {
        return null;
    }
    let i = 5;
    if (body[i++] !== 0x0a) {  // field 1, wire type 2 (length-delimited)
        return null;
    }
    let length = 0;
    for (let shift = 0; shift <= 14; shift += 7) {
        const b = body[i++];
        length |= (b & 0x7f) << shift;
        if (!(b & 0x80)) {
            return i + length <= body.length ? body.slice(i, i + length).toString() : null;
        }
    }
    return null;  // a model name of 2 MB or more: not one of ours
}

function refuse(r, status, message) {
    r.variables.grpc_refusal_status = String(status);
    r.variables.grpc_refusal_message = message;
    r.internalRedirect('@grpc_refused');
}

function route(r) {
    const body = r.requestBuffer;
    if (body === undefined) {
        return refuse(r, RESOURCE_EXHAUSTED, 'request too large for the gateway: at most '
            + r.variables.grpc_max_body);
    }
    const model = modelName(body);
    if (model === null) {
        return refuse(r, INVALID_ARGUMENT, 'the gateway reads the model name from an '
            + 'uncompressed request: send it without gRPC compression');
    }
    const served = r.variables.grpc_models.split(' ');
    if (served.indexOf(model) < 0) {
        // Into a header: at most 64 printable characters of it, '%' escaped (grpc-message
        // is percent-encoded).
        const shown = model.slice(0, 64).replace(/[^\x20-\x7e]/g, '?').replace(/%/g, '%25');
        return refuse(r, NOT_FOUND, "unknown model '" + shown + "': this gateway serves "
            + served.join(', '));
    }
    r.variables.grpc_model = model;
    r.internalRedirect(r.uri.endsWith('/ModelInfer') ? '@grpc_infer' : '@grpc_model');
}

export default {route: route};
