//! Scheme text form and compression configs: parsing, round trips, first-match-wins rules.

use std::path::Path;

use anemone_compress::{
    CompressConfig, CompressError, LinearBits, LinearMode, PaletteMode, Scheme,
};

#[test]
fn scheme_text_round_trips() {
    let cases = [
        ("int8", Scheme::int8()),
        ("INT4", Scheme::int4()),
        (
            "int4:block=32",
            Scheme::Linear {
                bits: LinearBits::Int4,
                block_size: Some(32),
                mode: LinearMode::Auto,
            },
        ),
        (
            "int8:symmetric",
            Scheme::Linear {
                bits: LinearBits::Int8,
                block_size: None,
                mode: LinearMode::Symmetric,
            },
        ),
        (
            "int4:block=16:grid",
            Scheme::Linear {
                bits: LinearBits::Int4,
                block_size: Some(16),
                mode: LinearMode::Grid,
            },
        ),
        ("source", Scheme::Source { block_size: None }),
        (
            "source:block=16",
            Scheme::Source {
                block_size: Some(16),
            },
        ),
        ("lut4", Scheme::kmeans(4)),
        (
            "lut6:uniform:group=16",
            Scheme::Palettize {
                bits: 6,
                mode: PaletteMode::Uniform,
                group_size: 16,
            },
        ),
        (
            "lut8:group=0:kmeans",
            Scheme::Palettize {
                bits: 8,
                mode: PaletteMode::Kmeans,
                group_size: 0,
            },
        ),
    ];
    for (text, want) in cases {
        let got: Scheme = text.parse().unwrap();
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string().parse::<Scheme>().unwrap(), want, "{text}");
    }
    assert_eq!(Scheme::kmeans(4).to_string(), "lut4:kmeans:group=32");
    for bad in [
        "int5",
        "lut5",
        "lut",
        "int8:group=4",
        "lut4:block=2",
        "int8:block=x",
        "lut4:fast",
        "lut4:grid",
        "int8:kmeans",
        "source:grid",
        "source:block=0",
        "",
    ] {
        let e = bad.parse::<Scheme>().unwrap_err();
        assert!(
            matches!(e, CompressError::InvalidScheme { .. }),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
    }
}

#[test]
fn first_matching_rule_wins_then_default() {
    let text = r#"{
        "rules": [
            { "pattern": "*.mlp.down_proj*", "scheme": "lut6" },
            { "pattern": "*.mlp.*", "scheme": "lut4" },
            { "pattern": "*.self_attn.?_proj.weight", "scheme": "lut6:group=16" },
            { "pattern": "*embed_tokens*", "scheme": "none" },
            { "pattern": "lm_head.weight", "scheme": "lut8" }
        ],
        "default": "int8"
    }"#;
    let c = CompressConfig::from_json_str(text, Path::new("mixed.json")).unwrap();
    let lut6_16 = Scheme::Palettize {
        bits: 6,
        mode: PaletteMode::Kmeans,
        group_size: 16,
    };
    for (name, want) in [
        (
            "model.layers.0.mlp.down_proj.weight",
            Some(Scheme::kmeans(6)),
        ),
        ("model.layers.0.mlp.up_proj.weight", Some(Scheme::kmeans(4))),
        ("model.layers.11.self_attn.q_proj.weight", Some(lut6_16)),
        ("model.layers.11.self_attn.o_proj.weight", Some(lut6_16)),
        // `?` is exactly one character
        (
            "model.layers.11.self_attn.qk_proj.weight",
            Some(Scheme::int8()),
        ),
        ("model.embed_tokens.weight", None),
        ("lm_head.weight", Some(Scheme::kmeans(8))),
        ("lm_head.weight.extra", Some(Scheme::int8())),
        ("anything.else", Some(Scheme::int8())),
    ] {
        assert_eq!(c.scheme_for(name), want, "{name}");
    }
    // the config serializes (for the manifest) and reads back to the same rules
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(
        CompressConfig::from_json_str(&json, Path::new("again.json")).unwrap(),
        c
    );
    assert!(json.contains("\"none\""), "{json}");
}

#[test]
fn no_default_means_uncompressed_and_uniform_applies_everywhere() {
    let c = CompressConfig::from_json_str(
        r#"{"rules":[{"pattern":"*.mlp.*","scheme":"int4"}]}"#,
        Path::new("c.json"),
    )
    .unwrap();
    assert_eq!(c.scheme_for("x.mlp.gate"), Some(Scheme::int4()));
    assert_eq!(c.scheme_for("x.attn"), None);
    let u = CompressConfig::uniform(Scheme::kmeans(4));
    assert_eq!(u.scheme_for("whatever"), Some(Scheme::kmeans(4)));
}

#[test]
fn bad_configs_name_the_file_and_the_problem() {
    for (text, needle) in [
        (r#"{"rules":[{"pattern":"*","scheme":"lut7"}]}"#, "lut7"),
        (
            r#"{"rules":[{"pattern":"","scheme":"int8"}]}"#,
            "empty pattern",
        ),
        (r#"{"rulez":[]}"#, "rulez"),
        (r#"{"rules":[{"scheme":"int8"}]}"#, "pattern"),
        ("not json", "expected"),
    ] {
        let e = CompressConfig::from_json_str(text, Path::new("conf/bad.json")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("conf/bad.json") && msg.contains(needle),
            "{text}: {msg}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let e = CompressConfig::from_path(&missing).unwrap_err();
    assert!(e.to_string().contains("missing.json"), "{e}");
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"default":"lut4:uniform"}"#).unwrap();
    let c = CompressConfig::from_path(&good).unwrap();
    assert_eq!(
        c.scheme_for("a"),
        Some(Scheme::Palettize {
            bits: 4,
            mode: PaletteMode::Uniform,
            group_size: 32
        })
    );
}
