"""The gateway's nginx config: every branch of its template renders a config nginx -t accepts.

test_token_buckets and test_openai_gateway check the shaped and the OpenAI configs in detail;
these are the variants they leave out, and what holds for every rendered config.
"""

from __future__ import annotations

import json
import os
import pwd

import pytest

from gateway import shaping
from gateway.nginx import config, rollout

ONE = config.Upstreams(("127.0.0.1:9",), ("127.0.0.1:10",))
SEVERAL = config.Upstreams(("127.0.0.1:9", "127.0.0.1:11", "127.0.0.1:13"), ("127.0.0.1:10",))
LISTEN = config.Listen(18000, 18001)
# Everything the limits file allows that the committed one does not use: another header,
# rates below one a second, keys of every allowed character, models without a bucket.
ODD = shaping.parse_limits(
    {
        "header": "X-Tenant-Key",
        "anonymous": {"rate": 0.3, "capacity": 1},
        "tenants": {
            "t_1": {"keys": ["Key.With~Odd!Chars#1", "k2k2k2k2/+=?"], "rate": 1 / 7, "capacity": 5},
            "t-2": {"keys": ["k3k3k3k3"], "rate": 100.0, "capacity": 2},
        },
        "models": {"embed": {"rate": 2.5, "capacity": 7}},
    }
)
VARIANTS = {
    "plain": config.Gateway(ONE, LISTEN),
    "operators-and-user": config.Gateway(
        SEVERAL,
        LISTEN,
        config.Clients(operators=("127.0.0.1", "10.1.2.3/8", "::1")),
        config.Runtime(user=pwd.getpwuid(os.geteuid()).pw_name),
    ),
    "odd-limits-openai": config.Gateway(
        SEVERAL, LISTEN, shaping=config.Shaping(ODD), openai=config.OpenAI()
    ),
    "anonymous-only": config.Gateway(
        ONE,
        LISTEN,
        shaping=config.Shaping(shaping.parse_limits({"anonymous": {"rate": 3, "capacity": 3}})),
    ),
    "rollout-compared-openai": config.Gateway(
        ONE,
        LISTEN,
        openai=config.OpenAI(),
        rollout=rollout.Rollout(
            ("127.0.0.1:19",),
            ("127.0.0.1:20",),
            rollout.Shares((("embed", 5), ("classify", 0))),
            shadow="127.0.0.1:21",
        ),
    ),
    "rollout-sticky-shaped": config.Gateway(
        SEVERAL,
        LISTEN,
        shaping=config.Shaping(ODD),
        rollout=rollout.Rollout(
            ("127.0.0.1:19",), ("127.0.0.1:20",), rollout.Shares((("embed", 100),), sticky=True)
        ),
    ),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_passes_nginx_t_and_leaves_no_gaps(nginx_binary, name):
    text = config.render(VARIANTS[name])
    config.check_config(text, nginx_binary)
    # A section that is off leaves no line behind: no blank line opening a block, none doubled.
    assert "{\n\n" not in text and "\n\n\n" not in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_operators_are_checked_addresses_and_every_server_is_tried_once():
    text = config.render(VARIANTS["operators-and-user"])
    assert text.count("            allow 10.0.0.0/8;\n") == 2  # HTTP's and gRPC's
    assert "proxy_next_upstream_tries 3;" in text and "grpc_next_upstream_tries 3;" in text
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        config.render(
            config.Gateway(ONE, LISTEN, config.Clients(operators=("10.0.0.0/8; allow all",)))
        )
    with pytest.raises(ValueError, match="at least one server"):
        config.Upstreams(("127.0.0.1:9",), ())


def test_a_rollout_picks_the_servers_of_each_request_s_version():
    text = config.render(VARIANTS["rollout-compared-openai"])
    # Every inference path (Triton's HTTP, OpenAI's requests, gRPC) goes by the version...
    assert text.count("proxy_pass http://$http_servers") == 2
    assert "proxy_pass http://$http_servers/v2/models/$openai_triton/infer;" in text
    assert text.count("grpc_pass grpc://$grpc_servers;") == 1
    assert "upstream triton_http_canary {" in text and "upstream triton_grpc_canary {" in text
    # ...metadata, readiness and health stay on the stable servers...
    assert "proxy_pass http://triton_http;" in text and "grpc_pass grpc://triton_grpc;" in text
    # ...and each inference path copies its sampled requests to the comparator (OpenAI's
    # script once the call's buckets admitted it) and logs its version, which the plain
    # gateway does not.
    assert text.count("mirror /_rollout_shadow;") == 2
    assert text.count("set $openai_shadow /_rollout_shadow;") == 1
    assert '"version":"$rollout_version"' in text
    assert f'js_var $rollout_file "{rollout.SHARES_FILE}";' in text
    assert "js_set $rollout_version rollout.version;" in text
    plain = config.render(VARIANTS["plain"])
    assert "rollout" not in plain and "$http_servers" not in plain


def test_shares_are_written_whole_and_moved(tmp_path):
    shares = rollout.Shares((("embed", 0.5), ("classify", 0), ("embed_int8", 100)))
    assert json.loads(shares.as_json()) == {
        "models": {"embed": 0.5, "classify": 0, "embed_int8": 100},
        "sticky": False,
    }
    path = tmp_path / rollout.SHARES_FILE
    rollout.write(path, shares)
    before, after = rollout.move(path, {"classify": 50}, sticky=True)
    assert before == shares and rollout.current(path) == after
    assert dict(after.models) == {"embed": 0.5, "classify": 50, "embed_int8": 100}
    assert after.sticky
    # A refused move leaves the file as it was.
    with pytest.raises(ValueError, match="a share is a percent"):
        rollout.move(path, {"embed": 150})
    assert rollout.current(path) == after


@pytest.mark.parametrize(
    "models, message",
    [
        ((("tokenize", 5),), "no rollout of 'tokenize'"),
        ((("embed", 101),), "a share is a percent"),
        ((("embed", -1),), "a share is a percent"),
    ],
)
def test_a_share_out_of_range_or_of_an_unserved_model_is_refused(models, message):
    with pytest.raises(ValueError, match=message):
        rollout.Shares(models)
