// A rollout's choice of version for each request: "stable" or "canary".
//
// The shares are read from the file $rollout_file names (JSON: {"models": {model: percent},
// "sticky": bool}, written by `python -m gateway.nginx rollout`) on every request, so that
// moving them is a rewrite of that file (a rename, atomic): no reload, no worker replaced, no
// client connection closed. A request of a model without a share goes to the stable servers.
//   per request: the first 32 bits of $request_id, random, against the share
//   sticky:      a hash of the tenant ($rollout_tenant) and the model, so one tenant's requests
//                all go one way
// nginx caches the variable for the request and its subrequests: every Triton request of one
// OpenAI call meets the same version.

import fs from 'fs';

const STABLE = 'stable';
const CANARY = 'canary';
const NONE = {models: {}, sticky: false};

function shares(r) {
    try {
        return JSON.parse(fs.readFileSync(r.variables.rollout_file, 'utf8'));
    } catch (e) {
        // No file, or a torn one: nothing goes to the canary, and the log says why.
        r.error('rollout: cannot read ' + r.variables.rollout_file + ': ' + e.message);
        return NONE;
    }
}

// FNV-1a over the string's UTF-16 units, in [0, 1).
function unitHash(text) {
    let h = 2166136261;
    for (let i = 0; i < text.length; i++) {
        h = Math.imul(h ^ text.charCodeAt(i), 16777619) >>> 0;
    }
    return h / 4294967296;
}

function version(r) {
    const model = r.variables.triton_model;
    const state = shares(r);
    const share = state.models[model];
    if (!share) {
        return STABLE;
    }
    const u = state.sticky
        ? unitHash(r.variables.rollout_tenant + ' ' + model)
        : parseInt(r.variables.request_id.slice(0, 8), 16) / 4294967296;
    return u * 100 < share ? CANARY : STABLE;
}

// The models in the rollout (space-separated), for the comparator.
function models(r) {
    return Object.keys(shares(r).models).join(' ');
}

export default {version: version, models: models};
