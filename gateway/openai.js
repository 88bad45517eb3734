// OpenAI's embeddings API in front of Triton, in nginx's njs (0.7.9, Debian 12's
// libnginx-mod-http-js): no process of its own on the hot path.
//
// POST /v1/embeddings turns one OpenAI request into Triton inference requests on the model it
// names (nginx sends `embed` to the ensemble `embed_with_tokens`, `embed_int8` to
// `embed_int8_with_tokens`): TEXT [n, 1] in, EMBEDDING [n, d] back (as Triton's JSON
// numbers, or as raw float32 bytes for base64) and TOKENS [n, 1] (word pieces, for usage).
// A text over the model's word pieces is refused (400 naming it) unless the call says
// `"truncate": true` (as text-embeddings-inference's API does), which sends TRUNCATE [n, 1].
// A call of more texts than the model's max_batch_size goes out as several requests at once;
// their results are joined in order. GET /v1/models lists the models.
// gateway/nginx/parts/openai_locations.j2 holds the locations and sets:
//   $openai_models      the model ids, space-separated
//   $openai_max_inputs  the most texts one call may carry (413 above)
//   $openai_chunk       texts per Triton request (the models' max_batch_size)
//   $openai_dimensions  "id:d ..." the floats of one embedding of each model (HIDDEN_SIZE of
//                       pipelines/embedding.py, or an exported service's own width)
//   $openai_shaping     1 with limits.toml: the call takes its tokens first
//   $openai_shadow      a rollout's comparator location: admitted calls are copied there
// and the internal locations /_openai/<model id>/shape, where the token buckets of
// limits.toml count the call (429 with Retry-After) before its body is parsed, and
// /_openai/<model id>/infer, which proxies to Triton's HTTP endpoint.
// Errors have OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

const INFER = '/_openai/';

function reply(r, status, body, headers) {
    r.headersOut['Content-Type'] = 'application/json';
    for (const name in headers || {}) {
        r.headersOut[name] = headers[name];
    }
    r.return(status, JSON.stringify(body));
}

function ApiError(status, message, param, code, headers) {
    this.status = status;
    this.message = message;
    this.param = param === undefined ? null : param;
    this.code = code === undefined ? null : code;
    this.headers = headers || {};
}

function fail(r, e) {
    const type = e.status === 429 ? 'rate_limit_error'
        : e.status >= 500 ? 'server_error' : 'invalid_request_error';
    reply(r, e.status, {error: {message: e.message, type: type, param: e.param, code: e.code}},
        e.headers);
}

function widthOf(r, model) {
    const pairs = r.variables.openai_dimensions.split(' ');
    for (var i = 0; i < pairs.length; i++) {
        const cut = pairs[i].lastIndexOf(':');
        if (pairs[i].slice(0, cut) === model) {
            return parseInt(pairs[i].slice(cut + 1));
        }
    }
    throw new ApiError(500, 'no width configured for ' + model);
}

function modelList(r) {
    return r.variables.openai_models.split(' ').filter(function (m) { return m.length > 0; });
}

function models(r) {
    if (r.method !== 'GET') {
        return fail(r, new ApiError(405, 'use GET for /v1/models'));
    }
    const data = modelList(r).map(function (id) {
        return {id: id, object: 'model', created: 0, owned_by: 'triton'};
    });
    reply(r, 200, {object: 'list', data: data});
}

// The request's JSON, after checking that the body is UTF-8 (JSON text must be).
function body(r) {
    const raw = r.requestBuffer;
    if (raw === undefined) {
        throw new ApiError(413, 'request body too large', null, 'request_too_large');
    }
    let text;
    try {
        text = new TextDecoder('utf-8', {fatal: true}).decode(raw);
    } catch (e) {
        throw new ApiError(400, 'request body is not valid UTF-8', null, 'invalid_encoding');
    }
    try {
        return JSON.parse(text);
    } catch (e) {
        throw new ApiError(400, 'request body is not valid JSON: ' + e.message, null,
            'invalid_json');
    }
}

function isInteger(x) {
    return typeof x === 'number' && Number.isInteger(x);
}

// The texts of `input`: a string or a list of strings. Token ids are refused.
function texts(input, maxInputs) {
    if (typeof input === 'string') {
        input = [input];
    }
    if (!Array.isArray(input)) {
        throw new ApiError(400, "'input' must be a string or a list of strings", 'input');
    }
    if (input.length === 0) {
        throw new ApiError(400, "'input' is empty: send at least one text", 'input');
    }
    if (input.length > maxInputs) {
        throw new ApiError(413, "'input' has " + input.length + ' texts; at most ' + maxInputs
            + ' fit in one request', 'input', 'too_many_inputs');
    }
    if (isInteger(input[0]) || (Array.isArray(input[0]) && isInteger(input[0][0]))) {
        throw new ApiError(400, 'token ids are not supported: send the texts, this server '
            + "tokenizes them with the model's own tokenizer", 'input', 'token_ids_unsupported');
    }
    for (let i = 0; i < input.length; i++) {
        if (typeof input[i] !== 'string') {
            throw new ApiError(400, "'input[" + i + "]' must be a string, not "
                + (input[i] === null ? 'null' : typeof input[i]), 'input');
        }
        if (input[i].length === 0) {
            throw new ApiError(400, "'input[" + i + "]' is empty: expected at least one character",
                'input');
        }
    }
    return input;
}

function parse(r) {
    const request = body(r);
    if (request === null || typeof request !== 'object' || Array.isArray(request)) {
        throw new ApiError(400, 'request body must be a JSON object');
    }
    const known = modelList(r);
    if (typeof request.model !== 'string') {
        throw new ApiError(400, "'model' must be the name of a model: " + known.join(', '),
            'model');
    }
    if (known.indexOf(request.model) < 0) {
        throw new ApiError(404, "model '" + request.model + "' does not exist; embedding models: "
            + known.join(', '), 'model', 'model_not_found');
    }
    const encoding = request.encoding_format === undefined || request.encoding_format === null
        ? 'float' : request.encoding_format;
    if (encoding !== 'float' && encoding !== 'base64') {
        throw new ApiError(400, "'encoding_format' must be 'float' or 'base64'",
            'encoding_format');
    }
    const dimensions = widthOf(r, request.model);
    if (request.dimensions !== undefined && request.dimensions !== null
        && request.dimensions !== dimensions) {
        throw new ApiError(400, "'dimensions' is not supported: " + request.model
            + ' embeddings have ' + dimensions + ' dimensions', 'dimensions');
    }
    const truncate = request.truncate === undefined || request.truncate === null
        ? false : request.truncate;
    if (typeof truncate !== 'boolean') {
        throw new ApiError(400, "'truncate' must be true or false", 'truncate');
    }
    const maxInputs = parseInt(r.variables.openai_max_inputs);
    return {model: request.model, texts: texts(request.input, maxInputs), encoding: encoding,
        dimensions: dimensions, truncate: truncate};
}

// Triton's request for some texts. Floats come back as Triton's own JSON numbers, which this
// script splices into its answer as they are: formatting every float of a text here cost more than
// the gateway's whole work (docs/models.md, "The gateway's cost"). base64 comes back as the
// raw float32 bytes it encodes.
function tritonRequest(chunk, encoding, truncate) {
    const inputs = [{name: 'TEXT', shape: [chunk.length, 1], datatype: 'BYTES', data: chunk}];
    if (truncate) {
        inputs.push({name: 'TRUNCATE', shape: [chunk.length, 1], datatype: 'BOOL',
            data: chunk.map(function () { return true; })});
    }
    return JSON.stringify({
        inputs: inputs,
        outputs: [
            {name: 'EMBEDDING', parameters: {binary_data: encoding === 'base64'}},
            {name: 'TOKENS', parameters: {binary_data: false}},
        ],
    });
}

// A Triton error as the OpenAI error a client should see; `offset`: the call's index of the
// first text of the request that failed, so that a text's error names it as the call does.
function tritonError(r, response, model, offset) {
    let message = 'upstream error ' + response.status;
    try {
        message = JSON.parse(response.responseText).error || message;
    } catch (e) {
        // not JSON: nginx's own page (no server answered)
    }
    if (response.status === 429) {
        // add_header does not reach a subrequest's answer: the seconds come from the same map
        // ($retry_after, by tenant and model), read for this call.
        return new ApiError(429, message, null, 'rate_limit_exceeded',
            {'Retry-After': r.variables.retry_after || '1'});
    }
    // No server answered, or the model is not (yet) loaded there.
    if (response.status >= 500 || /unknown model|not ready|unavailable/i.test(message)) {
        return new ApiError(503, 'model ' + model + ' is not ready: ' + message, null,
            'model_not_ready', {'Retry-After': '1'});
    }
    message = message.replace(/TEXT\[(\d+)\]/, function (match, i) {
        return 'input[' + (offset + parseInt(i)) + ']';
    }).replace('set TRUNCATE to true', "set 'truncate' to true");
    return new ApiError(response.status === 400 ? 400 : 500, message, 'input');
}

// The numbers of output `name` in Triton's JSON text, as written there: "a,b,c".
function jsonData(text, name) {
    const at = text.indexOf('"name":"' + name + '"');
    const start = at < 0 ? -1 : text.indexOf('"data":[', at);
    if (start < 0) {
        throw new ApiError(500, 'the model answered no ' + name);
    }
    return text.slice(start + 8, text.indexOf(']', start));
}

// [{embedding: its JSON text, tokens}] of one Triton response: `count` texts of `dimensions`.
function decode(response, count, encoding, dimensions) {
    const items = [];
    let tokens;
    if (encoding === 'base64') {
        const buffer = response.responseBuffer;
        const headerLength = parseInt(response.headersOut['Inference-Header-Content-Length']);
        const header = buffer.slice(0, headerLength).toString();
        tokens = JSON.parse('[' + jsonData(header, 'TOKENS') + ']');
        const size = dimensions * 4;
        // The only binary output: EMBEDDING's bytes follow the header.
        if (buffer.length - headerLength !== count * size) {
            throw new ApiError(500, 'the model answered ' + (buffer.length - headerLength)
                + ' bytes of embeddings for ' + count + ' texts');
        }
        for (let i = 0; i < count; i++) {
            const start = headerLength + i * size;
            items.push('"' + buffer.slice(start, start + size).toString('base64') + '"');
        }
    } else {
        const text = response.responseText;
        tokens = JSON.parse('[' + jsonData(text, 'TOKENS') + ']');
        const floats = jsonData(text, 'EMBEDDING').split(',');
        if (floats.length !== count * dimensions) {
            throw new ApiError(500, 'the model answered ' + floats.length + ' floats for '
                + count + ' texts of ' + dimensions);
        }
        for (let i = 0; i < count; i++) {
            items.push('[' + floats.slice(i * dimensions, (i + 1) * dimensions).join(',') + ']');
        }
    }
    if (tokens.length !== count) {
        throw new ApiError(500, 'the model counted tokens of ' + tokens.length + ' texts, not '
            + count);
    }
    return items.map(function (embedding, i) { return {embedding: embedding, tokens: tokens[i]}; });
}

// The model a call names, found without parsing its body: its buckets count first, so that a
// tenant over its rate costs no parse. `parse` then checks that the body names the same one.
function scanModel(r) {
    const raw = r.requestBuffer;
    const found = raw === undefined ? null
        : /"model"\s*:\s*"([A-Za-z0-9_.-]{1,64})"/.exec(raw.toString());
    return found === null ? '-' : found[1];
}

async function embeddings(r) {
    try {
        if (r.method !== 'POST') {
            throw new ApiError(405, 'use POST for /v1/embeddings');
        }
        const named = scanModel(r);
        // For the buckets and the access log: one of the served ids, or none.
        r.variables.openai_model = modelList(r).indexOf(named) < 0 ? '' : named;
        if (r.variables.openai_shaping === '1') {
            const shaped = await r.subrequest(INFER + named + '/shape');
            if (shaped.status !== 204) {
                throw tritonError(r, shaped, named, 0);
            }
        }
        const call = parse(r);
        if (call.model !== named) {
            throw new ApiError(400, "'model' must be given once, as a string", 'model');
        }
        if (r.variables.openai_shadow) {
            // Only now, admitted and parsed: a refused call costs the comparator nothing. The
            // copy carries the call's body and headers; nginx waits for it in the background.
            r.subrequest(r.variables.openai_shadow, {method: 'POST', detached: true});
        }
        const size = parseInt(r.variables.openai_chunk);
        const chunks = [];
        for (let i = 0; i < call.texts.length; i += size) {
            chunks.push(call.texts.slice(i, i + size));
        }
        const responses = await Promise.all(chunks.map(function (chunk) {
            return r.subrequest(INFER + call.model + '/infer',
                {method: 'POST', body: tritonRequest(chunk, call.encoding, call.truncate)});
        }));
        // Written out rather than JSON.stringify'd: the embeddings are JSON text already.
        const data = [];
        let tokens = 0;
        for (let c = 0; c < chunks.length; c++) {
            if (responses[c].status !== 200) {
                throw tritonError(r, responses[c], call.model, c * size);
            }
            const items = decode(responses[c], chunks[c].length, call.encoding, call.dimensions);
            for (let i = 0; i < items.length; i++) {
                data.push('{"object":"embedding","index":' + data.length + ',"embedding":'
                    + items[i].embedding + '}');
                tokens += items[i].tokens;
            }
        }
        r.headersOut['Content-Type'] = 'application/json';
        r.return(200, '{"object":"list","data":[' + data.join(',') + '],"model":'
            + JSON.stringify(call.model) + ',"usage":{"prompt_tokens":' + tokens
            + ',"total_tokens":' + tokens + '}}');
    } catch (e) {
        if (e instanceof ApiError) {
            return fail(r, e);
        }
        r.error('openai.embeddings: ' + e.stack);
        fail(r, new ApiError(500, 'internal error: ' + e.message));
    }
}

// The answer of /_openai/<id>/shape once its buckets admitted the call. A content handler, not
// `return 204`: `return` answers in nginx's rewrite phase, before limit_req has counted.
function admitted(r) {
    r.return(204);
}

export default {embeddings: embeddings, models: models, admitted: admitted};
