# Generates pyjson_vectors.json: CPython 3.11.7 json.loads (C scanner) on tricky inputs.
# Run: python3 gen_pyjson_vectors.py > pyjson_vectors.json
import json
cases = [
 '{"a": 1}', ' {"a": [1, 2.5, -0, -0.0, 1e5, 1E-7, 1e16, 123456789012345678901234567890]} ',
 '{"a": 1, "a": 2, "b": 3}', '', '   ', 'x', '"UNREAL"', 'UNREAL', 'TRUE', 'true', 'tru', 'nul', 'null', 'NaN', 'Infinity', '-Infinity', '-Inf', '-', '-x', '01', '1.', '1.e5', '1e', '1e+', '1e+5', '.5',
 '{"a":1,}', '[1,]', '[1 2]', '{"a" 1}', '{"a":1 "b":2}', "{'a':1}", '{a:1}', '{"a":1}{"b":2}', '{"a":1} x', '{', '[', '{"a":', '{"a"', '"abc', '"a\\', '"a\\x"', '"\\u12"', '"\\u12g4"', '"\\ud83d\\ude00"', '"\\ud83d x"', '"\\u0041"',
 '"a\nb"', '{"r": "line1\nline2"}', '"tab\there"', '\ufeff{}', '{"a": "x" \n "b": "y"}', '{"a":"He said "hi" ok"}',
 '{"verified": FALSE}', '{"verified": false}', '[[[]]]', '{"a": {"b": [true, false, null]}}', '"\\/\\b\\f\\n\\r\\t\\"\\\\"', '1 2', '\n\n  {"a":\n  1,\n  "b" 2}', '{"é": "ü", "k": "\u00e9x"}', '[1e400, -1e400]', '0.1', '100.0', '1e22', '1.5e-5', '0.0001', '{"a":1,"b":}',
 '{"a": NaN, "b": -Infinity}', '"\\ud800"', '{"a":[1,2,,3]}', '{"x": 1]', '[1}', '{ }', '[ ]', '{"a" :  1  }', '"\\u00e9\\u00E9"', '"\x7f\x1f"',
]
out = []
for s in cases:
    for strict in (True, False):
        try:
            v = json.loads(s, strict=strict)
            res = {"ok": repr(v)}
        except json.JSONDecodeError as e:
            res = {"err": str(e), "msg": e.msg, "pos": e.pos}
        out.append({"input": s, "strict": strict, **res})
print(json.dumps(out, indent=0, ensure_ascii=True))
