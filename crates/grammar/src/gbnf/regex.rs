//! A regular expression as a GBNF expression that matches the whole text, as a regex
//! constraint does: `^` at its start and `$` at its end say nothing more, and any other
//! assertion (a word boundary, a line anchor inside) is refused.

use regex_syntax::hir::{Class, Hir, HirKind, Look};

use super::{Expr, GbnfError};

/// The expression that matches exactly the texts `pattern` matches whole.
pub fn regex(pattern: &str) -> Result<Expr, GbnfError> {
    let hir = regex_syntax::Parser::new()
        .parse(pattern)
        .map_err(|e| GbnfError(format!("the regular expression: {e}")))?;
    convert(&hir, true, true)
}

fn convert(hir: &Hir, at_start: bool, at_end: bool) -> Result<Expr, GbnfError> {
    Ok(match hir.kind() {
        HirKind::Empty => Expr::empty(),
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0).map_err(|_| {
                GbnfError("the regular expression matches bytes that are not UTF-8".into())
            })?;
            Expr::text(text)
        }
        HirKind::Class(class) => {
            let ranges: Vec<(char, char)> = match class {
                Class::Unicode(class) => class
                    .ranges()
                    .iter()
                    .map(|r| (r.start(), r.end()))
                    .collect(),
                Class::Bytes(class) => class
                    .ranges()
                    .iter()
                    .map(|r| {
                        if r.end() < 0x80 {
                            Ok((char::from(r.start()), char::from(r.end())))
                        } else {
                            Err(GbnfError(
                                "the regular expression matches bytes that are not UTF-8".into(),
                            ))
                        }
                    })
                    .collect::<Result<_, _>>()?,
            };
            if ranges.is_empty() {
                return Err(GbnfError(
                    "the regular expression has a class that matches nothing".into(),
                ));
            }
            Expr::Class(ranges)
        }
        HirKind::Look(look) => match look {
            Look::Start if at_start => Expr::empty(),
            Look::End if at_end => Expr::empty(),
            _ => {
                return Err(GbnfError(format!(
                    "the regular expression's assertion {look:?} is only read as `^` at its start or `$` at its end"
                )));
            }
        },
        HirKind::Repetition(repetition) => Expr::repeat(
            convert(&repetition.sub, false, false)?,
            repetition.min,
            repetition.max,
        ),
        HirKind::Capture(capture) => convert(&capture.sub, at_start, at_end)?,
        HirKind::Concat(items) => {
            let zero_width = |h: &Hir| matches!(h.kind(), HirKind::Look(_));
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let first = at_start && items[..i].iter().all(zero_width);
                let last = at_end && items[i + 1..].iter().all(zero_width);
                out.push(convert(item, first, last)?);
            }
            Expr::Seq(out)
        }
        HirKind::Alternation(items) => Expr::Alt(
            items
                .iter()
                .map(|item| convert(item, at_start, at_end))
                .collect::<Result<_, _>>()?,
        ),
    })
}
