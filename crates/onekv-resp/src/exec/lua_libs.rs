//! The libraries Redis gives scripts beyond Lua's own, written here because they are small and
//! must behave as Redis's do: `cjson` (JSON encode/decode, through serde_json) and `bit`
//! (LuaBitOp's 32-bit operations). `cmsgpack` and `struct` are not provided (docs/redis.md).
//!
//! Owns: those two tables. Does not own the environment they are put in (`lua`).

use std::cell::Cell;
use std::rc::Rc;

use mlua::{LightUserData, Lua, Table, Value, Variadic};

/// Deepest nesting cjson encodes or decodes, and the most a script may set: the encoder recurses,
/// on the stack of the thread the script runs on (Lua cjson allows 1000; serde_json decodes 128).
const MAX_JSON_NESTING: usize = 128;
/// Largest JSON text cjson encodes or decodes (a decoded value is built whole in memory first).
const MAX_JSON_BYTES: usize = 8 << 20;

/// `cjson.null`: a light userdata holding NULL, as in Lua cjson.
fn json_null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

/// cjson's settings, which scripts may change for their own run.
struct JsonSettings {
    encode_max_depth: Cell<usize>,
    decode_max_depth: Cell<usize>,
    /// Whether NaN and infinities are written (as `nan`, `inf`, `-inf`: not standard JSON).
    encode_invalid_numbers: Cell<bool>,
}

/// The `cjson` table: `encode`, `decode`, `null`, and Lua cjson's settings (`encode_max_depth`,
/// `decode_max_depth`, `encode_invalid_numbers`; the others are accepted and change nothing).
pub(super) fn cjson(lua: &Lua) -> mlua::Result<Table> {
    let settings = Rc::new(JsonSettings {
        encode_max_depth: Cell::new(MAX_JSON_NESTING),
        decode_max_depth: Cell::new(MAX_JSON_NESTING),
        encode_invalid_numbers: Cell::new(false),
    });
    let table = lua.create_table()?;
    let encoding = settings.clone();
    table.set(
        "encode",
        lua.create_function(move |_, value: Value| {
            let mut text = String::new();
            encode(&value, 0, &encoding, &mut text)?;
            Ok(text)
        })?,
    )?;
    let decoding = settings.clone();
    table.set(
        "decode",
        lua.create_function(move |lua, text: mlua::String| {
            if text.as_bytes().len() > MAX_JSON_BYTES {
                return Err(mlua::Error::runtime(format!(
                    "onekv: cjson decodes at most {MAX_JSON_BYTES} bytes"
                )));
            }
            let json: serde_json::Value = serde_json::from_slice(&text.as_bytes()).map_err(|error| {
                mlua::Error::runtime(format!("Expected value but found invalid JSON: {error}"))
            })?;
            decode(lua, json, 0, decoding.decode_max_depth.get())
        })?,
    )?;
    table.set("null", json_null())?;
    let depth_setting = |select: fn(&JsonSettings) -> &Cell<usize>| {
        let settings = settings.clone();
        lua.create_function(move |_, depth: Option<f64>| {
            let cell = select(&settings);
            if let Some(depth) = depth {
                if !(1.0..=MAX_JSON_NESTING as f64).contains(&depth) {
                    return Err(mlua::Error::runtime(format!(
                        "bad argument #1 (expected integer between 1 and {MAX_JSON_NESTING})"
                    )));
                }
                cell.set(depth as usize);
            }
            Ok(cell.get() as f64)
        })
    };
    table.set("encode_max_depth", depth_setting(|settings| &settings.encode_max_depth)?)?;
    table.set("decode_max_depth", depth_setting(|settings| &settings.decode_max_depth)?)?;
    let invalid = settings.clone();
    table.set(
        "encode_invalid_numbers",
        lua.create_function(move |_, allow: Option<Value>| {
            if let Some(allow) = allow {
                invalid.encode_invalid_numbers.set(!matches!(allow, Value::Boolean(false) | Value::Nil));
            }
            Ok(invalid.encode_invalid_numbers.get())
        })?,
    )?;
    for setting in
        ["encode_keep_buffer", "encode_number_precision", "encode_sparse_array", "decode_invalid_numbers"]
    {
        table.set(setting, lua.create_function(|_, _: Variadic<Value>| Ok(true))?)?;
    }
    Ok(table)
}

fn encode(value: &Value, depth: usize, settings: &JsonSettings, out: &mut String) -> mlua::Result<()> {
    if out.len() > MAX_JSON_BYTES {
        return Err(mlua::Error::runtime(format!("onekv: cjson encodes at most {MAX_JSON_BYTES} bytes")));
    }
    match value {
        Value::Nil => out.push_str("null"),
        Value::LightUserData(pointer) if pointer.0.is_null() => out.push_str("null"),
        Value::Boolean(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Integer(number) => out.push_str(&number.to_string()),
        Value::Number(number) if number.is_finite() => out.push_str(&format_g14(*number)),
        Value::Number(number) if settings.encode_invalid_numbers.get() => out.push_str(match *number {
            number if number.is_nan() => "nan",
            number if number > 0.0 => "inf",
            _ => "-inf",
        }),
        Value::Number(_) => {
            return Err(mlua::Error::runtime("Cannot serialise number: must not be NaN or Inf"));
        }
        Value::String(text) => {
            out.push_str(&serde_json::Value::String(text.to_string_lossy()).to_string());
        }
        Value::Table(table) => {
            if depth + 1 > settings.encode_max_depth.get() {
                return Err(mlua::Error::runtime(format!(
                    "Cannot serialise, excessive nesting ({})",
                    depth + 1
                )));
            }
            encode_table(table, depth, settings, out)?
        }
        other => {
            return Err(mlua::Error::runtime(format!(
                "Cannot serialise {}: type not supported",
                other.type_name()
            )));
        }
    }
    Ok(())
}

/// A table as Lua cjson writes it: an array if its keys are exactly 1..n (holes allowed if not
/// excessively sparse, written as null), otherwise an object with string and number keys; an
/// empty table is `{}`.
fn encode_table(table: &Table, depth: usize, settings: &JsonSettings, out: &mut String) -> mlua::Result<()> {
    let mut pairs = Vec::new();
    let mut max_index = 0usize;
    let mut is_array = true;
    for pair in table.pairs::<Value, Value>() {
        let (key, value) = pair?;
        let index = match &key {
            Value::Integer(index) if *index >= 1 => Some(*index as usize),
            Value::Number(index) if *index >= 1.0 && index.fract() == 0.0 => Some(*index as usize),
            _ => None,
        };
        match index {
            Some(index) => max_index = max_index.max(index),
            None => is_array = false,
        }
        pairs.push((key, value));
    }
    if is_array && !pairs.is_empty() {
        if max_index > pairs.len() * 2 && max_index > 10 {
            return Err(mlua::Error::runtime("Cannot serialise table: excessively sparse array"));
        }
        out.push('[');
        for index in 1..=max_index {
            if index > 1 {
                out.push(',');
            }
            encode(&table.raw_get::<Value>(index)?, depth + 1, settings, out)?;
        }
        out.push(']');
        return Ok(());
    }
    out.push('{');
    for (position, (key, value)) in pairs.iter().enumerate() {
        if position > 0 {
            out.push(',');
        }
        let key = match key {
            Value::String(text) => text.to_string_lossy(),
            Value::Integer(number) => number.to_string(),
            Value::Number(number) => format_g14(*number),
            _ => {
                return Err(mlua::Error::runtime(
                    "Cannot serialise table: table key must be a number or string",
                ));
            }
        };
        out.push_str(&serde_json::Value::String(key).to_string());
        out.push(':');
        encode(value, depth + 1, settings, out)?;
    }
    out.push('}');
    Ok(())
}

/// A number as C's `%.14g` writes it (Lua cjson's default precision).
fn format_g14(number: f64) -> String {
    if number == 0.0 {
        return "0".into();
    }
    let scientific = format!("{number:.13e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let trim = |text: String| -> String {
        if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
    };
    if !(-4..14).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa.to_string()), exponent.abs());
    }
    let decimals = usize::try_from(13 - exponent).unwrap_or(0);
    trim(format!("{number:.decimals$}"))
}

/// `json` as Lua values; containers nested deeper than `max_depth` are refused.
fn decode(lua: &Lua, json: serde_json::Value, depth: usize, max_depth: usize) -> mlua::Result<Value> {
    let container = matches!(json, serde_json::Value::Array(_) | serde_json::Value::Object(_));
    if container && depth + 1 > max_depth {
        return Err(mlua::Error::runtime("Found too many nested data structures"));
    }
    Ok(match json {
        serde_json::Value::Null => json_null(),
        serde_json::Value::Bool(flag) => Value::Boolean(flag),
        serde_json::Value::Number(number) => Value::Number(number.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(text) => Value::String(lua.create_string(text)?),
        serde_json::Value::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for item in items {
                table.raw_push(decode(lua, item, depth + 1, max_depth)?)?;
            }
            Value::Table(table)
        }
        serde_json::Value::Object(fields) => {
            let table = lua.create_table_with_capacity(0, fields.len())?;
            for (key, value) in fields {
                table.raw_set(key, decode(lua, value, depth + 1, max_depth)?)?;
            }
            Value::Table(table)
        }
    })
}

/// `math.random` and `math.randomseed` as Redis gives scripts: a 48-bit linear congruential
/// generator (`rand48`'s) seeded alike at the start of every run, so a script that runs again (after
/// a conflict) draws the same numbers, and one script's seed never reaches another's.
pub(super) fn random(lua: &Lua) -> mlua::Result<(mlua::Function, mlua::Function)> {
    const MASK: u64 = (1 << 48) - 1;
    let state = Rc::new(Cell::new(0x330E_u64));
    let next = state.clone();
    let random = lua.create_function(move |_, (low, high): (Option<f64>, Option<f64>)| {
        next.set(next.get().wrapping_mul(0x5_DEEC_E66D).wrapping_add(0xB) & MASK);
        let unit = (next.get() >> 17) as f64 / f64::from(1u32 << 31);
        let (low, high) = match (low, high) {
            (None, None) => return Ok(unit),
            (Some(high), None) => (1.0, high.floor()),
            (Some(low), Some(high)) => (low.floor(), high.floor()),
            (None, Some(_)) => unreachable!("Lua passes arguments in order"),
        };
        if low > high {
            return Err(mlua::Error::runtime("bad argument to 'random' (interval is empty)"));
        }
        Ok((unit * (high - low + 1.0)).floor() + low)
    })?;
    let randomseed = lua.create_function(move |_, seed: f64| {
        state.set(((seed as i64 as u64) << 16 | 0x330E) & MASK);
        Ok(())
    })?;
    Ok((random, randomseed))
}

/// The `bit` table: LuaBitOp's operations on numbers as 32-bit signed integers.
pub(super) fn bit(lua: &Lua) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    let unary =
        |operation: fn(i32) -> i32| lua.create_function(move |_, x: f64| Ok(f64::from(operation(tobit(x)))));
    let shift = |operation: fn(i32, u32) -> i32| {
        lua.create_function(move |_, (x, n): (f64, f64)| {
            Ok(f64::from(operation(tobit(x), (tobit(n) & 31) as u32)))
        })
    };
    let fold = |operation: fn(i32, i32) -> i32| {
        lua.create_function(move |_, (first, rest): (f64, Variadic<f64>)| {
            Ok(f64::from(rest.iter().fold(tobit(first), |result, x| operation(result, tobit(*x)))))
        })
    };
    table.set("tobit", unary(|x| x)?)?;
    table.set("bnot", unary(|x| !x)?)?;
    table.set("bswap", unary(i32::swap_bytes)?)?;
    table.set("band", fold(|a, b| a & b)?)?;
    table.set("bor", fold(|a, b| a | b)?)?;
    table.set("bxor", fold(|a, b| a ^ b)?)?;
    table.set("lshift", shift(|x, n| ((x as u32) << n) as i32)?)?;
    table.set("rshift", shift(|x, n| ((x as u32) >> n) as i32)?)?;
    table.set("arshift", shift(|x, n| x >> n)?)?;
    table.set("rol", shift(|x, n| (x as u32).rotate_left(n) as i32)?)?;
    table.set("ror", shift(|x, n| (x as u32).rotate_right(n) as i32)?)?;
    table.set(
        "tohex",
        lua.create_function(|_, (x, digits): (f64, Option<f64>)| {
            let digits = digits.map_or(8, tobit);
            let (upper, count) = (digits < 0, digits.unsigned_abs().min(8) as usize);
            let text =
                if upper { format!("{:08X}", tobit(x) as u32) } else { format!("{:08x}", tobit(x) as u32) };
            Ok(text[8 - count..].to_string())
        })?,
    )?;
    Ok(table)
}

/// A number as LuaBitOp sees it: modulo 2^32, as a signed 32-bit integer.
fn tobit(x: f64) -> i32 {
    if !x.is_finite() {
        return 0;
    }
    x.round().rem_euclid(4_294_967_296.0) as u64 as u32 as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_percent_14g() {
        assert_eq!(format_g14(0.0), "0");
        assert_eq!(format_g14(100.0), "100");
        assert_eq!(format_g14(0.1 + 0.2), "0.3");
        assert_eq!(format_g14(-5000.0), "-5000");
        assert_eq!(format_g14(0.0003), "0.0003");
        assert_eq!(format_g14(1023.2), "1023.2");
        assert_eq!(format_g14(1e20), "1e+20");
        assert_eq!(format_g14(1.5e-7), "1.5e-07");
        assert_eq!(format_g14(123456789012345.0), "1.2345678901234e+14");
    }

    #[test]
    fn bit_operations_wrap_to_32_bits() {
        assert_eq!(tobit(4_294_967_295.0), -1);
        assert_eq!(tobit(4_294_967_296.0), 0);
        assert_eq!(tobit(-1.0), -1);
        assert_eq!(tobit(2_147_483_648.0), i32::MIN);
    }
}
