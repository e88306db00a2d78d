//! Step timing: the models live in [`switchyard_core::perf`] (the router predicts with
//! them too); here, reading a measured profile from JSON or NPZ, with arrays
//! `prefill_isl`, `prefill_ttft_ms`, `decode_active_kv_tokens`, `decode_context_length` and
//! `decode_itl` (rows: active KV tokens, columns: context length).

use std::path::Path;

use ndarray_npy::ReadNpzError;
pub use switchyard_core::perf::{InvalidProfile, PerfModel, Profile, StepShape};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error("cannot read profile {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid profile JSON in {path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("invalid profile NPZ in {path}: {source}")]
    Npz { path: String, source: NpzError },
    #[error(transparent)]
    Shape(#[from] InvalidProfile),
}

/// Why an NPZ profile could not be read.
#[derive(Debug, Error)]
pub enum NpzError {
    #[error(transparent)]
    Open(#[from] std::io::Error),
    #[error(transparent)]
    Read(#[from] ReadNpzError),
    #[error("missing array {0}")]
    Missing(String),
    #[error("{name}: {source}")]
    Array { name: String, source: ReadNpzError },
}

/// Loads a profile from `.json` or `.npz`.
pub fn load(path: &Path) -> Result<PerfModel, ProfileError> {
    let name = path.display().to_string();
    let profile = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npz"))
    {
        read_npz(path).map_err(|source| ProfileError::Npz { path: name, source })?
    } else {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: name.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ProfileError::Json { path: name, source })?
    };
    Ok(PerfModel::from_profile(profile)?)
}

fn read_npz(path: &Path) -> Result<Profile, NpzError> {
    use ndarray::{Array1, Array2};
    use ndarray_npy::NpzReader;

    let file = std::fs::File::open(path)?;
    let mut npz = NpzReader::new(file)?;
    let names = npz.names()?;
    let key = |name: &str| {
        let with_ext = format!("{name}.npy");
        if names.iter().any(|n| n == &with_ext) {
            Ok(with_ext)
        } else if names.iter().any(|n| n == name) {
            Ok(name.to_string())
        } else {
            Err(NpzError::Missing(name.to_string()))
        }
    };
    let mut vector = |name: &str| -> Result<Vec<f64>, NpzError> {
        let a: Array1<f64> = npz.by_name(&key(name)?).map_err(|source| NpzError::Array {
            name: name.to_string(),
            source,
        })?;
        Ok(a.to_vec())
    };
    let prefill_isl = vector("prefill_isl")?;
    let prefill_ttft_ms = vector("prefill_ttft_ms")?;
    let decode_active_kv_tokens = vector("decode_active_kv_tokens")?;
    let decode_context_length = vector("decode_context_length")?;
    let itl: Array2<f64> = npz
        .by_name(&key("decode_itl")?)
        .map_err(|source| NpzError::Array {
            name: "decode_itl".to_string(),
            source,
        })?;
    let decode_itl = itl.rows().into_iter().map(|r| r.to_vec()).collect();
    Ok(Profile {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens,
        decode_context_length,
        decode_itl,
        // Not in Dynamo's NPZ format: the phases added, as its mocker charges them.
        mixed_step_saving: 0.0,
        prefill_context_ms: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile {
            prefill_isl: vec![100.0, 1000.0, 4000.0],
            prefill_ttft_ms: vec![10.0, 40.0, 160.0],
            decode_active_kv_tokens: vec![0.0, 10_000.0],
            decode_context_length: vec![100.0, 1100.0],
            decode_itl: vec![vec![5.0, 7.0], vec![15.0, 25.0]],
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.0,
        }
    }

    #[test]
    fn json_and_npz_profiles_load() {
        use ndarray::{Array1, Array2};
        let dir = std::env::temp_dir().join(format!("switchyard-perf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("profile.json");
        std::fs::write(&json, serde_json::to_string(&profile()).unwrap()).unwrap();
        assert_eq!(load(&json).unwrap(), PerfModel::Interpolated(profile()));

        let npz = dir.join("profile.npz");
        let p = profile();
        let mut w = ndarray_npy::NpzWriter::new(std::fs::File::create(&npz).unwrap());
        w.add_array("prefill_isl", &Array1::from(p.prefill_isl.clone()))
            .unwrap();
        w.add_array("prefill_ttft_ms", &Array1::from(p.prefill_ttft_ms.clone()))
            .unwrap();
        w.add_array(
            "decode_active_kv_tokens",
            &Array1::from(p.decode_active_kv_tokens.clone()),
        )
        .unwrap();
        w.add_array(
            "decode_context_length",
            &Array1::from(p.decode_context_length.clone()),
        )
        .unwrap();
        let itl = Array2::from_shape_vec((2, 2), p.decode_itl.concat()).unwrap();
        w.add_array("decode_itl", &itl).unwrap();
        w.finish().unwrap();
        assert_eq!(load(&npz).unwrap(), PerfModel::Interpolated(profile()));

        assert!(
            load(&dir.join("missing.json"))
                .unwrap_err()
                .to_string()
                .contains("cannot read profile")
        );
        std::fs::write(dir.join("bad.npz"), b"not a zip").unwrap();
        assert!(
            load(&dir.join("bad.npz"))
                .unwrap_err()
                .to_string()
                .contains("invalid profile NPZ")
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
