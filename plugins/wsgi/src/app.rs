//! The application: `MODULE[:ATTR]` from the command line, imported and
//! checked to be a WSGI callable. ATTR may be an app factory called with
//! literal arguments, `MODULE:create_app()` or `MODULE:make('prod', debug=False)`,
//! as gunicorn takes it (Flask's application factories).

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
    /// For a factory: the text between its parentheses (literal
    /// arguments), called once at load to get the application.
    pub call: Option<String>,
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
        let (attr, call) = match attr.split_once('(') {
            Some((name, rest)) => match rest.strip_suffix(')') {
                Some(args) => (name.trim_end(), Some(args.to_owned())),
                None => {
                    return Err(format!(
                        "`{arg}` is not MODULE[:ATTR]: the factory call `{attr}` has no closing `)`"
                    ));
                }
            },
            None => (attr, None),
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
            call,
        })
    }

    pub fn display(&self) -> String {
        match &self.call {
            Some(args) => format!("{}:{}({args})", self.module, self.attr),
            None => format!("{}:{}", self.module, self.attr),
        }
    }
}

/// Imports the module and resolves the attribute: the WSGI callable.
pub fn load_app<'py>(
    py: Python<'py>,
    spec: &AppSpec,
    app_dir: &Path,
) -> Result<Bound<'py, PyAny>, InitError> {
    let context = format!("spec `{}`", spec.display());
    let mut obj = import_attr(py, &spec.module, &spec.attr, &context, app_dir)?;
    if let Some(args) = &spec.call {
        obj = call_factory(py, &obj, args).map_err(|e| {
            InitError::failed(format!(
                "the app factory `{}` failed (--app-dir {}):\n{}",
                spec.display(),
                app_dir.display(),
                m0_pyhost::interp::format_exception(py, &e)
            ))
        })?;
    }
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

/// Calls `factory` with the literal arguments written in `args`, parsed
/// by Python's `ast` and evaluated with `ast.literal_eval`: never code.
fn call_factory<'py>(
    py: Python<'py>,
    factory: &Bound<'py, PyAny>,
    args: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let ast = py.import("ast")?;
    let call = ast
        .call_method1("parse", (format!("f({args})"), "<app spec>", "eval"))?
        .getattr("body")?;
    let literal = |node: Bound<'py, PyAny>| ast.call_method1("literal_eval", (node,));
    let positional = pyo3::types::PyList::empty(py);
    for node in call.getattr("args")?.try_iter()? {
        positional.append(literal(node?)?)?;
    }
    let keywords = pyo3::types::PyDict::new(py);
    for kw in call.getattr("keywords")?.try_iter()? {
        let kw = kw?;
        let name = kw.getattr("arg")?;
        if name.is_none() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "`**` arguments are not literals; name each keyword",
            ));
        }
        keywords.set_item(name, literal(kw.getattr("value")?)?)?;
    }
    factory.call(pyo3::types::PyTuple::new(py, positional)?, Some(&keywords))
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
                attr: "application".into(),
                call: None,
            }
        );
        assert_eq!(AppSpec::parse("m:app.wsgi").unwrap().attr, "app.wsgi");
    }

    #[test]
    fn a_factory_call_keeps_its_arguments() {
        let spec = AppSpec::parse("app:create_app('dev', debug=True)").unwrap();
        assert_eq!(spec.attr, "create_app");
        assert_eq!(spec.call.as_deref(), Some("'dev', debug=True"));
        assert_eq!(spec.display(), "app:create_app('dev', debug=True)");
        assert_eq!(
            AppSpec::parse("app:make()").unwrap().call.as_deref(),
            Some("")
        );
    }

    #[test]
    fn spec_rejects_nonsense() {
        for bad in [
            "", "a:", ":b", "1x:app", "a b", "a:b:c", "a..b", "a:f(", "a:(1)",
        ] {
            assert!(AppSpec::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
