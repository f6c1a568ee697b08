//! Deterministic fuzz-style checks: the parsers never panic, and whatever
//! they accept re-encodes to something they accept again, unchanged.

use super::*;

/// xorshift64: small, deterministic, good enough to shake the parsers.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    /// Either random bytes or a random sequence of grammar tokens, so that
    /// both the error paths and the accepting paths are exercised.
    fn input(&mut self) -> String {
        if self.next().is_multiple_of(2) {
            self.bytes()
        } else {
            self.tokens()
        }
    }

    fn tokens(&mut self) -> String {
        const TOKENS: &[&str] = &[
            "A,T,1,2:",
            "B,AMD X,16384,76:",
            ";",
            ":",
            ",",
            "0",
            "3-5",
            "7",
            "-",
            "ü",
            "{",
            "}",
            "\"",
            "\"g\":\"",
            "\"g\":\"0-3\"",
            "2147483648",
            "4294967296",
        ];
        let len = self.below(8);
        (0..len).map(|_| TOKENS[self.below(TOKENS.len())]).collect()
    }

    /// Random bytes (lossily made UTF-8, as annotation values are strings),
    /// biased towards the characters the grammars care about.
    fn bytes(&mut self) -> String {
        const ALPHABET: &[u8] = b",:;-0123456789AT[]{}\"\\ ";
        let len = self.below(40);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = self.next().to_le_bytes();
                if r[0] < 160 {
                    ALPHABET[usize::from(r[1]) % ALPHABET.len()]
                } else {
                    r[2]
                }
            })
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[test]
fn parsers_never_panic_on_random_input() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut accepted = [0usize; 4];
    for _ in 0..10_000 {
        let s = rng.input();
        if let Ok(c) = parse_pod_devices(DevicesAnnotation::Allocated, &s) {
            accepted[0] += 1;
            let again = encode_pod_devices(DevicesAnnotation::Allocated, &c).unwrap();
            assert_eq!(
                parse_pod_devices(DevicesAnnotation::Allocated, &again).unwrap(),
                c
            );
        }
        if let Ok(Some((_, rest))) = pop_next(&s) {
            accepted[1] += 1;
            parse_pod_devices(DevicesAnnotation::ToAllocate, &rest).unwrap();
        }
        if let Ok(l) = cu_allocated::CuList::parse(&s) {
            accepted[2] += 1;
            assert_eq!(cu_allocated::CuList::parse(&l.to_string()).unwrap(), l);
        }
        if let Ok(cu) = parse_cu_allocated(&s) {
            accepted[3] += 1;
            assert_eq!(parse_cu_allocated(&cu.encode().unwrap()).unwrap(), cu);
        }
        if let Ok(d) = parse_register(&s) {
            assert_eq!(
                parse_register(&register_annotation(&d).unwrap()).unwrap(),
                d
            );
        }
    }
    // The generator must reach the accepting paths, not only the errors.
    assert!(accepted.iter().all(|&n| n > 0), "{accepted:?}");
}

#[test]
fn register_parser_never_panics_on_mutated_json() {
    let base = br#"[{"id":"a","count":10,"devmem":1,"devcore":304,"type":"AMD X","numa":-1,"health":true,"custominfo":{"pciBDF":"0000:83:00.0"}}]"#;
    let mut rng = XorShift(42);
    let mut accepted = 0;
    for _ in 0..10_000 {
        let mut bytes = base.to_vec();
        for _ in 0..=rng.below(3) {
            let i = rng.below(bytes.len());
            bytes[i] = rng.next().to_le_bytes()[0];
        }
        let s = String::from_utf8_lossy(&bytes);
        if let Ok(d) = parse_register(&s) {
            accepted += 1;
            assert_eq!(
                parse_register(&register_annotation(&d).unwrap()).unwrap(),
                d
            );
        }
    }
    assert!(accepted > 0);
}
