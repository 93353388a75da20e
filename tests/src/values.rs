//! Test values shared by the sink's type tests (`exact_values.rs`, `typed_sink.rs`): integer
//! bounds written out independently of the sink's own code (an oracle that shares the code it
//! checks proves nothing), decimal arithmetic on them, and a seeded generator.

/// Signed maximum, signed minimum's magnitude and unsigned maximum, by width.
pub const BOUNDS: [(u16, &str, &str, &str); 6] = [
    (8, "127", "128", "255"),
    (16, "32767", "32768", "65535"),
    (32, "2147483647", "2147483648", "4294967295"),
    (
        64,
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
    ),
    (
        128,
        "170141183460469231731687303715884105727",
        "170141183460469231731687303715884105728",
        "340282366920938463463374607431768211455",
    ),
    (
        256,
        "57896044618658097711785492504343953926634992332820282019728792003956564819967",
        "57896044618658097711785492504343953926634992332820282019728792003956564819968",
        "115792089237316195423570985008687907853269984665640564039457584007913129639935",
    ),
];

/// `n + 1` of a decimal magnitude.
pub fn plus_one(n: &str) -> String {
    let mut digits: Vec<u8> = n.bytes().collect();
    let mut i = digits.len();
    loop {
        if i == 0 {
            digits.insert(0, b'1');
            break;
        }
        i -= 1;
        if digits[i] == b'9' {
            digits[i] = b'0';
        } else {
            digits[i] += 1;
            break;
        }
    }
    String::from_utf8(digits).unwrap()
}

/// A small seeded generator (xorshift), so a failure is reproducible.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A decimal number of `len` digits, no leading zero.
    pub fn digits(&mut self, len: usize) -> String {
        (0..len)
            .map(|i| {
                let d = (self.next() % 10) as u8;
                char::from(b'0' + if i == 0 { d % 9 + 1 } else { d })
            })
            .collect()
    }
}
