// What the gateway reads inside an inference request before it passes it on, in nginx's njs
// (0.7.9): a gRPC request's model, and, over both protocols, whether the request sets a
// parameter that only the operator may set.
//
// The model. ModelInfer, ModelReady and ModelMetadata name their model in field 1 of their
// message (model_name / name). A protobuf parser (Triton's) takes every field wherever it
// comes, skips the ones it does not know, and keeps the last of a field given twice: the
// first bytes of a message do not name its model. So the gateway walks every top-level field
// of the message, jumping over each one's contents (tensors included), and takes the request
// only when field 1 is there exactly once, as a string; a second one, which Triton would
// take instead, is refused. nginx writes the body to a file as it arrives
// (client_body_in_file_only, so a stream costs its small buffer, not its size, in memory)
// and the walk reads from it through a small window. `route` then sends the request on by
// an internal redirect, which keeps the body for grpc_pass:
//   @grpc_infer   a served model's ModelInfer: the tenant's and the model's buckets, then Triton
//   @grpc_model   a served model's readiness or metadata: straight to Triton
//   @grpc_refused anything else, with $grpc_refusal_status and $grpc_refusal_message
//
// The parameters. An inference request's `priority` and `timeout` place it in its model's
// queue (docs/operations.md#many-models-on-one-server-contention): through the gateway a
// tenant could put its requests ahead of every other tenant's. A request that sets either is
// refused: gRPC's ModelInferRequest.parameters in the same walk (INVALID_ARGUMENT), HTTP's
// JSON by `http` (400), which reads the JSON header (the whole body, or its first
// Inference-Header-Content-Length bytes) before redirecting to @http_infer.
// gateway/nginx/parts/*_server.j2 hold the locations and set $grpc_models (the served models,
// space-separated) and $infer_header_max (the most bytes of JSON the gateway reads).

import fs from 'fs';

// grpc-status codes.
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;
// The request parameters that are the operator's: Triton reads them from these keys.
const OWNED = ['priority', 'timeout'];
// More fields than any served model's request has (one per input, output, tensor's bytes and
// parameter, and a few more): the walk stops there rather than spend the worker on a body
// made of millions of tiny fields.
const MAX_FIELDS = 1024;
// Longer than any served model's name: such a name is not looked at.
const MAX_NAME = 256;
// Bytes read from the body file at a time: field headers, names, parameter keys.
const WINDOW = 16384;
// ModelInferRequest's fields: model_name 1, parameters 4 (map<string, InferParameter>, each
// entry a field 4 holding key 1 and value 2). ModelReady's and ModelMetadata's name is 1.
const NAME = 1;
const PARAMETERS = 4;
const ENTRY_KEY = 1;
// Protobuf wire types.
const VARINT = 0;
const FIXED64 = 1;
const LENGTH_DELIMITED = 2;
const FIXED32 = 5;

function Refusal(status, message) {
    this.status = status;
    this.message = message;
}

// Bytes of the body file by position, through one buffer: -1 past its end.
function reader(fd) {
    const window = Buffer.alloc(WINDOW);
    let start = 0;
    let length = 0;
    return function byteAt(pos) {
        if (pos < start || pos >= start + length) {
            start = pos;
            length = fs.readSync(fd, window, 0, WINDOW, pos);
            if (length <= 0) {
                length = 0;
                return -1;
            }
        }
        return window[pos - start];
    };
}

function malformed(why) {
    return new Refusal(INVALID_ARGUMENT, 'the gateway could not read this request: ' + why);
}

// The varint at pos, as [value, the position after it]. Values past 2^53 lose their low
// bits, which no length or tag compared below cares about: they exceed any body.
function varint(byteAt, pos, end, most) {
    let value = 0;
    for (let i = 0; i < most; i++) {
        const b = pos < end ? byteAt(pos) : -1;
        if (b < 0) {
            throw malformed('a field runs past the end of its message');
        }
        pos++;
        value += (b & 0x7f) * Math.pow(2, 7 * i);
        if (b < 0x80) {
            return [value, pos];
        }
    }
    throw malformed('a varint longer than protobuf allows');
}

// Calls visit(number, wireType, start, end) for each field of the message in [start, end),
// as a protobuf parser meets them; fields of every kind count towards budget.fields.
// Groups (wire types 3 and 4, long deprecated) and invalid wire types are refused.
function walk(byteAt, start, end, budget, visit) {
    let pos = start;
    while (pos < end) {
        if (++budget.fields > MAX_FIELDS) {
            throw malformed('more than ' + MAX_FIELDS + ' fields');
        }
        // A tag is a uint32 varint: at most 5 bytes.
        const tag = varint(byteAt, pos, end, 5);
        pos = tag[1];
        const number = Math.floor(tag[0] / 8);
        const wireType = tag[0] % 8;
        if (number === 0 || tag[0] > 0xffffffff) {
            throw malformed('an invalid field tag');
        }
        let contents = pos;
        if (wireType === VARINT) {
            pos = varint(byteAt, pos, end, 10)[1];
        } else if (wireType === FIXED64) {
            pos += 8;
        } else if (wireType === FIXED32) {
            pos += 4;
        } else if (wireType === LENGTH_DELIMITED) {
            const length = varint(byteAt, pos, end, 10);
            contents = length[1];
            pos = contents + length[0];
        } else {
            throw malformed('wire type ' + wireType + ' (groups are not accepted)');
        }
        if (pos > end) {
            throw malformed('a field runs past the end of its message');
        }
        visit(number, wireType, contents, pos);
    }
}

// The bytes [start, end) of the body file as text.
function text(fd, start, end) {
    const buffer = Buffer.alloc(end - start);
    const read = fs.readSync(fd, buffer, 0, end - start, start);
    return buffer.slice(0, read).toString();
}

// The request parameter of OWNED a map entry [start, end) names, or null. An entry that
// names its key twice is Triton's last; any of them is checked here.
function ownedEntry(fd, byteAt, start, end, budget) {
    let owned = null;
    walk(byteAt, start, end, budget, function (number, wireType, from, to) {
        if (number === ENTRY_KEY && wireType === LENGTH_DELIMITED && to - from <= MAX_NAME) {
            const key = text(fd, from, to);
            if (OWNED.indexOf(key) >= 0) {
                owned = key;
            }
        }
    });
    return owned;
}

function ownedRefusal(key) {
    return "request parameter '" + key + "' is not accepted through the gateway: a "
        + "request's priority and timeout are the operator's (send it without)";
}

// The model named by the one gRPC message in the body file: its name's text (null when
// longer than MAX_NAME), after walking every field. Throws a Refusal for a message that is
// compressed, not whole, not protobuf, or names its model other than once; and, for
// ModelInfer (`infer`), for one that sets a parameter of OWNED.
function requestModel(fd, infer) {
    const byteAt = reader(fd);
    // A gRPC message: 1 byte "compressed", 4 bytes big-endian length, the protobuf.
    const compressed = byteAt(0);
    if (compressed !== 0) {
        throw new Refusal(INVALID_ARGUMENT, compressed < 0
            ? 'the gateway could not read this request: no message'
            : 'the gateway reads the model name from an uncompressed request: send it '
            + 'without gRPC compression');
    }
    let length = 0;
    for (let i = 1; i <= 4; i++) {
        const b = byteAt(i);
        if (b < 0) {
            throw malformed('a message shorter than its header');
        }
        length = length * 256 + b;
    }
    const end = 5 + length;
    if ((length > 0 && byteAt(end - 1) < 0) || byteAt(end) >= 0) {
        throw malformed('the body is not one whole message');
    }
    const budget = {fields: 0};
    const names = [];
    walk(byteAt, 5, end, budget, function (number, wireType, from, to) {
        if (number === NAME) {
            if (wireType !== LENGTH_DELIMITED) {
                throw malformed('the model name is not a string');
            }
            names.push([from, to]);
        } else if (infer && number === PARAMETERS && wireType === LENGTH_DELIMITED) {
            const owned = ownedEntry(fd, byteAt, from, to, budget);
            if (owned !== null) {
                throw new Refusal(INVALID_ARGUMENT, ownedRefusal(owned));
            }
        }
    });
    if (names.length !== 1) {
        throw new Refusal(INVALID_ARGUMENT, names.length === 0
            ? 'the request names no model'
            : 'the request names its model ' + names.length + ' times: the gateway takes '
            + 'a request that names it once');
    }
    const from = names[0][0];
    const to = names[0][1];
    return to - from <= MAX_NAME ? text(fd, from, to) : null;
}

function refuse(r, status, message) {
    r.variables.grpc_refusal_status = String(status);
    r.variables.grpc_refusal_message = message;
    r.internalRedirect('@grpc_refused');
}

function route(r) {
    const path = r.variables.request_body_file;
    if (!path) {
        return refuse(r, INVALID_ARGUMENT, 'the gateway could not read this request: no message');
    }
    let model;
    const fd = fs.openSync(path, 'r');
    try {
        model = requestModel(fd, r.uri.endsWith('/ModelInfer'));
    } catch (e) {
        if (e instanceof Refusal) {
            return refuse(r, e.status, e.message);
        }
        throw e;
    } finally {
        fs.closeSync(fd);
    }
    const served = r.variables.grpc_models.split(' ');
    if (model === null || served.indexOf(model) < 0) {
        // Into a header: at most 64 printable characters of it, '%' escaped (grpc-message
        // is percent-encoded).
        const shown = (model || '').slice(0, 64).replace(/[^\x20-\x7e]/g, '?')
            .replace(/%/g, '%25');
        return refuse(r, NOT_FOUND, "unknown model '" + shown + "': this gateway serves "
            + served.join(', '));
    }
    r.variables.grpc_model = model;
    r.internalRedirect(r.uri.endsWith('/ModelInfer') ? '@grpc_infer' : '@grpc_model');
}

// HTTP -------------------------------------------------------------------------------------

// A JSON key's text that decodes to `key`: each character as itself or as a \u escape (with
// either case of hex digit).
function keyPattern(key) {
    let pattern = '';
    for (let i = 0; i < key.length; i++) {
        const hex = ('000' + key.charCodeAt(i).toString(16)).slice(-4)
            .replace(/[a-f]/g, function (d) { return '[' + d + d.toUpperCase() + ']'; });
        pattern += '(?:' + key[i] + '|\\\\u' + hex + ')';
    }
    return pattern;
}

// A key of OWNED, at any depth of a JSON text. In JSON a key's opening quote follows '{' or ','
// and whitespace, and a quote there is never inside a string: a string's own quotes are
// escaped, and one that closed a string could not be followed by a key's letters. So every
// such key a JSON parser (rapidjson, in Triton) finds matches this, and nothing inside a
// string value does, whatever its escapes. A text that is not JSON is Triton's to refuse.
const OWNED_KEY = new RegExp('[{,][ \\t\\n\\r]*"(' + OWNED.map(keyPattern).join('|')
    + ')"[ \\t\\n\\r]*:');

// The first `length` bytes of the request body, which nginx wrote to a file (fewer if the body
// is shorter).
function bodyHead(r, length) {
    const path = r.variables.request_body_file;
    if (!path) {
        return Buffer.alloc(0);
    }
    const fd = fs.openSync(path, 'r');
    try {
        const buffer = Buffer.alloc(Math.min(length, fs.fstatSync(fd).size));
        return buffer.slice(0, fs.readSync(fd, buffer, 0, buffer.length, 0));
    } finally {
        fs.closeSync(fd);
    }
}

// The JSON of an HTTP inference request, as Triton finds it: the first
// Inference-Header-Content-Length bytes of the body (Triton takes the first such header, so
// a second is refused), or the whole body without one; null for 0, where Triton reads the
// whole body as one tensor's bytes. Refusals: over $infer_header_max bytes (413), a length
// that is not a number or longer than the body (400, as Triton would).
function inferenceJson(r) {
    const max = parseInt(r.variables.infer_header_max);
    const given = r.rawHeadersIn.filter(function (header) {
        return header[0].toLowerCase() === 'inference-header-content-length';
    });
    if (given.length > 1) {
        throw new Refusal(400, 'Inference-Header-Content-Length given more than once');
    }
    let length = null;
    if (given.length === 1) {
        if (!/^[0-9]{1,10}$/.test(given[0][1])) {
            throw new Refusal(400, 'Inference-Header-Content-Length must be a number of bytes');
        }
        length = parseInt(given[0][1], 10);
        if (length === 0) {
            return null;
        }
    }
    const json = bodyHead(r, length === null ? max + 1 : Math.min(length, max + 1));
    if (json.length > max) {
        throw new Refusal(413, 'the JSON of an inference request is at most ' + max
            + ' bytes through the gateway: send large tensors as binary data '
            + '(Inference-Header-Content-Length)');
    }
    if (length !== null && json.length < length) {
        throw new Refusal(400, 'Inference-Header-Content-Length is longer than the body');
    }
    return json;
}

// An HTTP inference request: on to @http_infer, or refused with a JSON error.
function http(r) {
    try {
        const json = inferenceJson(r);
        // As text: bytes that are not UTF-8 become U+FFFD, and every ASCII byte (quotes,
        // backslashes) stays itself, as rapidjson reads it.
        const owned = json === null ? null : OWNED_KEY.exec(new TextDecoder().decode(json));
        if (owned !== null) {
            throw new Refusal(400, ownedRefusal(JSON.parse('"' + owned[1] + '"')));
        }
    } catch (e) {
        if (e instanceof Refusal) {
            r.headersOut['Content-Type'] = 'application/json';
            return r.return(e.status, JSON.stringify({error: e.message}));
        }
        throw e;
    }
    r.internalRedirect('@http_infer');
}

export default {route: route, http: http};
