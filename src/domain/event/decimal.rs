//! An exact decimal, as amounts and quantities are kept.

use std::fmt;

/// An exact decimal: money amounts, and quantities (weighed goods sell
/// fractions). Avro `decimal` with [`Decimal::SCALE`] places: floats would
/// lose cents (and IDR amounts carry fractions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Decimal {
    /// The amount times 10^SCALE.
    pub unscaled: i128,
}

impl Decimal {
    /// Decimal places kept; matches `scale` in the Avro schema.
    pub const SCALE: u32 = 4;

    /// Digits the schema's `decimal(38, 4)` holds: a value needing more is
    /// refused, never rounded.
    pub const PRECISION: u32 = 38;

    /// The bytes of an Avro `decimal`: the unscaled value's shortest
    /// big-endian two's complement (leading bytes that only repeat the sign
    /// dropped), as a buffer and where in it they start.
    pub fn twos_complement(self) -> ([u8; 16], usize) {
        let all = self.unscaled.to_be_bytes();
        let mut start = 0;
        while start < all.len() - 1
            && ((all[start] == 0x00 && all[start + 1] & 0x80 == 0)
                || (all[start] == 0xff && all[start + 1] & 0x80 != 0))
        {
            start += 1;
        }
        (all, start)
    }

    /// An integer, exactly: every 64-bit integer fits (38 digits hold
    /// 10^19 with its four places). `None` past [`Decimal::PRECISION`] digits.
    pub fn of_integer(n: i128) -> Option<Decimal> {
        let unscaled = n.checked_mul(10_i128.pow(Self::SCALE))?;
        (unscaled.unsigned_abs() < 10_u128.pow(Self::PRECISION)).then_some(Decimal { unscaled })
    }

    /// Parses a decimal literal such as `51000.5`, `-3` or `1e3`, exactly.
    /// Returns `None` when it has more than [`Decimal::SCALE`] places or more
    /// than [`Decimal::PRECISION`] digits in all.
    pub fn parse(text: &str) -> Option<Decimal> {
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(i) => (&text[..i], text[i + 1..].parse::<i32>().ok()?),
            None => (text, 0),
        };
        let (negative, digits) = match mantissa.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
        };
        let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        // The digits of both parts, read in place (no joined copy: this runs
        // for every amount of every event).
        let all_digits = || int_part.bytes().chain(frac_part.bytes());
        if !all_digits().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // value = significant × 10^-places, with zeros on either side dropped
        // first, so `1.00000` or `100e-2` never overflow on their way to fitting.
        let count = int_part.len() + frac_part.len();
        let leading_zeros = all_digits().take_while(|&b| b == b'0').count();
        if leading_zeros == count {
            return Some(Decimal { unscaled: 0 });
        }
        let trailing_zeros = all_digits().rev().take_while(|&b| b == b'0').count();
        let significant = all_digits()
            .skip(leading_zeros)
            .take(count - leading_zeros - trailing_zeros)
            .try_fold(0i128, |value, b| {
                value.checked_mul(10)?.checked_add(i128::from(b - b'0'))
            })?;
        let places = i64::try_from(frac_part.len()).ok()?
            - i64::from(exponent)
            - i64::try_from(trailing_zeros).ok()?;
        let shift = u32::try_from(i64::from(Self::SCALE) - places).ok()?;
        let value = significant.checked_mul(10i128.checked_pow(shift)?)?;
        if value.unsigned_abs() >= 10u128.pow(Self::PRECISION) {
            return None;
        }
        Some(Decimal {
            unscaled: if negative { -value } else { value },
        })
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scale = 10i128.pow(Self::SCALE);
        let sign = if self.unscaled < 0 { "-" } else { "" };
        let abs = self.unscaled.unsigned_abs();
        let (int, frac) = (abs / scale.unsigned_abs(), abs % scale.unsigned_abs());
        write!(
            f,
            "{sign}{int}.{frac:0width$}",
            width = Self::SCALE as usize
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An integer is the decimal its text parses to, at every 64-bit
    /// bound; past 38 digits there is none.
    #[test]
    fn an_integer_is_the_decimal_of_its_text() {
        for n in [0, 1, -1, 1100, i128::from(i64::MIN), i128::from(u64::MAX)] {
            assert_eq!(
                Decimal::of_integer(n),
                Decimal::parse(&n.to_string()),
                "{n}"
            );
        }
        assert_eq!(Decimal::of_integer(10_i128.pow(34)), None);
        assert_eq!(Decimal::of_integer(i128::MAX), None);
    }

    #[test]
    fn decimals_parse_exactly() {
        for (text, unscaled) in [
            ("51000.5", Some(510_005_000)),
            ("-3", Some(-30_000)),
            ("1e3", Some(10_000_000)),
            ("0.0001", Some(1)),
            ("1.50000", Some(15_000)),
            ("0.00001", None),
            ("abc", None),
            ("", None),
            ("000.000", Some(0)),
            ("+0012.3400", Some(123_400)),
            ("1.2.3", None),
            ("-", None),
            (".", None),
        ] {
            assert_eq!(
                Decimal::parse(text).map(|d| d.unscaled),
                unscaled,
                "{text:?}"
            );
        }
        assert_eq!(Decimal::parse("51000.5").unwrap().to_string(), "51000.5000");
        assert_eq!(Decimal::parse("-0.25").unwrap().to_string(), "-0.2500");
        // decimal(38, 4): 34 digits before the point at most.
        let widest = "9".repeat(34);
        assert_eq!(
            Decimal::parse(&format!("{widest}.9999"))
                .unwrap()
                .to_string(),
            format!("{widest}.9999")
        );
        assert_eq!(Decimal::parse(&format!("1{widest}")), None);
        assert_eq!(Decimal::parse(&"9".repeat(40)), None, "beyond i128 too");
        // Found by the property tests: zeros that do not change the value
        // must not push it past i128 on the way.
        let fits = format!("2{}.00000", "0".repeat(33));
        assert_eq!(
            Decimal::parse(&fits).unwrap().to_string(),
            format!("2{}.0000", "0".repeat(33))
        );
        assert_eq!(
            Decimal::parse(&format!("1{}e-30", "0".repeat(41)))
                .unwrap()
                .to_string(),
            "100000000000.0000"
        );
        assert_eq!(Decimal::parse("100e-2").unwrap().unscaled, 10_000);
        assert_eq!(Decimal::parse("0.000000").unwrap().unscaled, 0);
        assert_eq!(Decimal::parse("-0").unwrap().to_string(), "0.0000");
        assert_eq!(Decimal::parse("1e40"), None);
        assert_eq!(Decimal::parse("1e-5"), None);
    }
}
