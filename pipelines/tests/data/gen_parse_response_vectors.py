# Generates parse_response_vectors.json: the authors' LLmResponseParser.parse_response
# as described step by step in shared/specs/hypotermqa.md E.1, written in Python over
# CPython 3.11.7's real `json` module, then their callers (B.2) on each output.
# Run: python3 gen_parse_response_vectors.py > parse_response_vectors.json
import json

def repair(s):
    for _ in range(50):
        try:
            json.loads(s)
            return s
        except json.JSONDecodeError as e:
            if e.msg != "Expecting ',' delimiter":
                return s
            if s[e.pos - 1] == '"':
                s = s[:e.pos - 1] + s[e.pos - 1:].replace('"', "'", 2)
            else:
                s = s[:e.pos] + "," + s[e.pos:]
    return None

def parse_response(s):
    s = s.replace("WARNING: Failed to parse response: ", "").replace("<|im_end|>", "").strip()
    try:
        return json.loads(s)
    except Exception:
        pass
    s = s[s.find("{"):s.find("}") + 1].strip()
    try:
        return json.loads(s)
    except Exception:
        pass
    try:
        return json.loads(s.lower(), strict=False)
    except Exception:
        pass
    s = s.replace('"\n"', '",\n"')
    try:
        return json.loads(s, strict=False)
    except Exception:
        pass
    return json.loads(repair(s), strict=False)

def certainty(s):
    try:
        return {"ok": parse_response(s)["certainty"].lower()}
    except Exception as e:
        return {"err": type(e).__name__}

def verified(s):
    try:
        return {"ok": str(parse_response(s)["verified"]).lower()}
    except Exception as e:
        return {"err": type(e).__name__}

inputs = [
    '{"certainty": "UNREAL"}', ' \u3000{"certainty": "MENTIONED"}\x1c ', '```json\n{"certainty":"Unknown"}\n```',
    'no braces', '}', 'x}', '} {"certainty":"UNREAL"}', '{"a": {"certainty": "UNREAL"}}', '{"certainty": "UN}REAL"}',
    '{"certainty": "UNREAL"', 'WARNING: Failed to parse response: {"certainty":"UNKNOWN"}', '{"certainty":"MENTIONED"}<|im_end|>',
    '{"verified": TRUE}', '{"Verified": FALSE}', '{"verified": "False"}', '{"verified": false, "verified": true}',
    '{"term":"T"\n"reasoning":"a \"b\" c"\n"verified":"FALSE"}', '{"reasoning":"He said "no" and "yes" then", "certainty":"UNREAL"}',
    '{"reasoning":"tab\there", "certainty":"UNREAL"}', '{"reasoning":"nl\nhere" "certainty":"UNREAL"}',
    '{"certainty" "UNREAL"}', '{"certainty": UNREAL}', '{"CERTAINTY": "İSTANBUL"}', '{"certainty": "\u0130"}',
    '[{"certainty": "UNREAL"}]', '"MENTIONED"', 'null', '{}', '{"certainty": ["x"]}', '{"verified": 1.0}', '{"verified": NaN}',
    '{"a":1 "b":2 "c":3 "d":4 "e":5 "f":6 "g":7 "h":8 "i":9 "j":10 "k":11 "l":12 "m":13 "n":14 "o":15 "p":16 "q":17 "r":18 "s":19 "t":20 "u":21 "v":22 "w":23 "x":24 "y":25 "z":26 "aa":27 "ab":28 "ac":29 "ad":30 "ae":31 "af":32 "ag":33 "ah":34 "ai":35 "aj":36 "ak":37 "al":38 "am":39 "an":40 "ao":41 "ap":42 "aq":43 "ar":44 "as":45 "at":46 "au":47 "av":48 "aw":49 "ax":50 "ay":51 "certainty":"UNREAL"}',
    '{"x":1 "certainty":"UNREAL"}', '{"reasoning": "a"b", "verified": "TRUE"}',
]
out = [{"input": s, "certainty": certainty(s), "verified": verified(s)} for s in inputs]
print(json.dumps(out, indent=0, ensure_ascii=True))
