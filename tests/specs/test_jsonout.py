"""``--json`` documents stay strict JSON: non-finite floats become null, at any depth."""

from __future__ import annotations

import json
import math

from kvtier.specs.jsonout import finite


def test_infinities_and_nans_become_null_at_any_depth_and_the_rest_stays():
    doc = {
        "room": math.inf,
        "ratio": math.nan,
        "rows": [{"gb": 1.5, "limit": -math.inf}, (2, math.inf)],
        "name": "dram",
        "n": 3,
        "none": None,
    }
    out = finite(doc)
    assert out == {
        "room": None,
        "ratio": None,
        "rows": [{"gb": 1.5, "limit": None}, [2, None]],
        "name": "dram",
        "n": 3,
        "none": None,
    }
    json.dumps(out, allow_nan=False)  # strict JSON
    assert finite(0.5) == 0.5 and finite(math.inf) is None
