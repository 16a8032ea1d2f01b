//! The application: `MODULE[:ATTR]` from the command line, imported and
//! checked to be a WSGI callable.

use std::path::Path;

use m0_pyhost::interp::{import_attr, is_dotted_name, type_name};
use m0serve_plugin::InitError;
use pyo3::prelude::*;

/// `MODULE[:ATTR]` from the command line.
#[derive(Debug, PartialEq, Eq)]
pub struct AppSpec {
    pub module: String,
    /// Dotted attribute path inside the module, `application` by default.
    pub attr: String,
}

impl AppSpec {
    pub fn parse(arg: &str) -> Result<AppSpec, String> {
        let arg = arg.trim();
        if arg.is_empty() {
            return Err(
                "the wsgi plugin needs an application: ARG is MODULE[:ATTR] \
                        (for example `myproject.wsgi:application`)"
                    .into(),
            );
        }
        let (module, attr) = match arg.split_once(':') {
            Some((m, a)) => (m, a),
            None => (arg, "application"),
        };
        if !is_dotted_name(module) {
            return Err(format!(
                "`{arg}` is not MODULE[:ATTR]: `{module}` is not a dotted module name"
            ));
        }
        if !is_dotted_name(attr) {
            return Err(format!(
                "`{arg}` is not MODULE[:ATTR]: `{attr}` is not a (dotted) attribute name"
            ));
        }
        Ok(AppSpec {
            module: module.to_owned(),
            attr: attr.to_owned(),
        })
    }

    pub fn display(&self) -> String {
        format!("{}:{}", self.module, self.attr)
    }
}

/// Imports the module and resolves the attribute: the WSGI callable.
pub fn load_app<'py>(
    py: Python<'py>,
    spec: &AppSpec,
    app_dir: &Path,
) -> Result<Bound<'py, PyAny>, InitError> {
    let context = format!("spec `{}`", spec.display());
    let obj = import_attr(py, &spec.module, &spec.attr, &context, app_dir)?;
    if !obj.is_callable() {
        return Err(InitError::failed(format!(
            "`{}` is not callable: it is a `{}` object, a WSGI application must be \
             callable as app(environ, start_response)",
            spec.display(),
            type_name(&obj)
        )));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_to_application() {
        assert_eq!(
            AppSpec::parse("pkg.mod").unwrap(),
            AppSpec {
                module: "pkg.mod".into(),
                attr: "application".into()
            }
        );
        assert_eq!(AppSpec::parse("m:app.wsgi").unwrap().attr, "app.wsgi");
    }

    #[test]
    fn spec_rejects_nonsense() {
        for bad in ["", "a:", ":b", "1x:app", "a b", "a:b:c", "a..b", "a:f()"] {
            assert!(AppSpec::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
