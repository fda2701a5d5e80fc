//! Which scheme each tensor gets: glob patterns over tensor names, first match wins.
//!
//! ```json
//! { "rules": [
//!     { "pattern": "*.mlp.*",       "scheme": "lut4" },
//!     { "pattern": "*.self_attn.*", "scheme": "lut6:group=16" },
//!     { "pattern": "lm_head*",      "scheme": "lut8" },
//!     { "pattern": "*embed_tokens*", "scheme": "none" } ],
//!   "default": "int8" }
//! ```
//! `*` matches any run of characters (dots included), `?` exactly one; a pattern must match
//! the whole name. `"none"` (or `"fp16"`) keeps a tensor uncompressed; `default` (optional,
//! else uncompressed) applies when no rule matches.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{CompressError, Result};
use crate::scheme::Scheme;

/// One rule: tensors whose name matches `pattern` get `scheme` (`None` = stay fp16).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressRule {
    pub pattern: String,
    #[serde(with = "optional_scheme")]
    pub scheme: Option<Scheme>,
}

/// An ordered list of rules plus a default; what a bundle manifest records.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressConfig {
    #[serde(default)]
    pub rules: Vec<CompressRule>,
    #[serde(default, with = "optional_scheme")]
    pub default: Option<Scheme>,
}

mod optional_scheme {
    use super::Scheme;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Scheme>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(scheme) => s.collect_str(scheme),
            None => s.serialize_str("none"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Scheme>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        match text.as_deref().map(str::trim) {
            None => Ok(None),
            Some(t) if t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("fp16") => Ok(None),
            Some(t) => t.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

impl CompressConfig {
    /// Every tensor gets `scheme` (what single CLI flags such as `--quantize int8` mean).
    pub fn uniform(scheme: Scheme) -> CompressConfig {
        CompressConfig {
            rules: Vec::new(),
            default: Some(scheme),
        }
    }

    pub fn from_json_str(text: &str, path: &Path) -> Result<CompressConfig> {
        let config: CompressConfig =
            serde_json::from_str(text).map_err(|e| CompressError::Config {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        if let Some(rule) = config.rules.iter().find(|r| r.pattern.is_empty()) {
            return Err(CompressError::Config {
                path: path.to_path_buf(),
                detail: format!(
                    "empty pattern (scheme {:?})",
                    rule.scheme.map(|s| s.to_string())
                ),
            });
        }
        Ok(config)
    }

    pub fn from_path(path: &Path) -> Result<CompressConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| CompressError::Config {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        Self::from_json_str(&text, path)
    }

    /// The scheme for a tensor: the first rule whose pattern matches, else the default.
    pub fn scheme_for(&self, tensor: &str) -> Option<Scheme> {
        self.rules
            .iter()
            .find(|r| glob_match(&r.pattern, tensor))
            .map_or(self.default, |r| r.scheme)
    }
}

/// Whole-string glob match with `*` (any run) and `?` (one character).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // position of the last `*` and the text position it is currently stretched to
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}
