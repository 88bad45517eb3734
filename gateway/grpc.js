// The model of a gRPC request, read where nginx alone cannot see it: inside the body.
//
// ModelInfer, ModelReady and ModelMetadata each name their model in field 1 of their message
// (model_name / name), which every protobuf encoder writes first. nginx writes the body to a
// file as it arrives (client_body_in_file_only, so a stream costs its small buffer, not its
// size, in memory), this script reads the field from the file's first bytes, and sends the
// request on by an internal redirect, which keeps the body for grpc_pass:
//   @grpc_infer   a served model's ModelInfer: the tenant's and the model's buckets, then Triton
//   @grpc_model   a served model's readiness or metadata: straight to Triton
//   @grpc_refused anything else, with $grpc_refusal_status and $grpc_refusal_message
// gateway/nginx/nginx.conf.j2 holds the locations and sets $grpc_models (the served models,
// space-separated).

import fs from 'fs';

// grpc-status codes.
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;
// Enough for the message header and any served model's name.
const HEAD_BYTES = 1024;

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

// The first bytes of the request body, from the file nginx wrote it to (none: empty).
function head(r) {
    const path = r.variables.request_body_file;
    if (!path) {
        return Buffer.alloc(0);
    }
    const fd = fs.openSync(path, 'r');
    try {
        const buffer = Buffer.alloc(HEAD_BYTES);
        return buffer.slice(0, fs.readSync(fd, buffer, 0, HEAD_BYTES, 0));
    } finally {
        fs.closeSync(fd);
    }
}

function route(r) {
    const model = modelName(head(r));
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
