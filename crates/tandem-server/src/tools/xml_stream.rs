//! The streaming side of the Qwen XML format: `<function=NAME>` starts a call as soon as the
//! name is complete, and each `<parameter=…>…</parameter>` becomes one JSON fragment of the
//! arguments (`{"city":"Paris"`, `,"days":2`, then `}`) once its value is complete, typed from
//! the tool's schema. Text between parameters that is not a tag is dropped.

use serde_json::Value;

use super::{args, qwen_xml, Phase, Progress, ToolEvent, ToolParser, CALL_END, FUNC, FUNC_END, PARAM, PARAM_END};

impl ToolParser {
    /// `<function=NAME>` at the start of an XML call.
    pub(super) fn xml_header(&mut self, marker: usize, at_end: bool, out: &mut Vec<ToolEvent>) -> Progress {
        let t = self.buf.trim_start();
        if let Some(after) = t.strip_prefix(FUNC) {
            match after.find(['>', '<', '\n']) {
                Some(gt) => {
                    let name = after[..gt].trim().to_string();
                    if name.is_empty() || !after[gt..].starts_with('>') {
                        return Progress::Continue; // Buffered
                    }
                    let lead = self.buf.len() - t.len();
                    self.buf.drain(..lead + FUNC.len() + gt + 1);
                    let index = self.start_call(name.clone(), out);
                    self.phase = Phase::XmlParams { index, name, count: 0 };
                    Progress::Continue
                }
                None if !at_end => {
                    self.phase = Phase::Header;
                    Progress::Wait
                }
                None => Progress::Continue,
            }
        } else if !at_end && FUNC.starts_with(t) && marker != usize::MAX {
            self.phase = Phase::Header;
            Progress::Wait
        } else {
            Progress::Continue
        }
    }

    /// The parameters of an XML call, each emitted as a JSON fragment once its value is complete.
    pub(super) fn xml_params(
        &mut self,
        marker: usize,
        index: Option<usize>,
        name: String,
        count: usize,
        at_end: bool,
        out: &mut Vec<ToolEvent>,
    ) -> Progress {
        let t = self.buf.trim_start();
        let lead = self.buf.len() - t.len();
        if t.starts_with(FUNC_END) || (at_end && !t.starts_with(PARAM)) {
            args(out, index, if count == 0 { "{}" } else { "}" });
            let end = if t.starts_with(FUNC_END) { lead + FUNC_END.len() } else { self.buf.len() };
            self.buf.drain(..end);
            if self.markers.get(marker).and_then(|m| m.close) == Some(FUNC_END) {
                self.end_call();
            } else {
                self.phase = Phase::Tail;
            }
            return Progress::Continue;
        }
        let waiting = Phase::XmlParams { index, name: name.clone(), count };
        if let Some(after) = t.strip_prefix(PARAM) {
            // The name runs to the first `>`; a `<` or newline first makes it junk.
            let Some(gt) = after.find(['>', '<', '\n']) else {
                self.phase = waiting;
                return if at_end { self.force_close(index, count) } else { Progress::Wait };
            };
            if !after[gt..].starts_with('>') || after[..gt].trim().is_empty() {
                return self.junk(waiting);
            }
            let pname = after[..gt].trim().to_string();
            let value_all = &after[gt + 1..];
            let ends =
                [value_all.find(PARAM_END), value_all.find(PARAM), value_all.find(FUNC_END), value_all.find(CALL_END)];
            let Some(end) = ends.iter().flatten().min().copied().or(at_end.then_some(value_all.len())) else {
                self.phase = waiting;
                return Progress::Wait;
            };
            let value = &value_all[..end];
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            let typed = qwen_xml::typed(value, self.schemas.param(&name, &pname));
            let sep = if count == 0 { "{" } else { "," };
            let fragment = format!("{sep}{}:{}", Value::String(pname.clone()), typed);
            let consumed = lead
                + PARAM.len()
                + gt
                + 1
                + end
                + if value_all[end..].starts_with(PARAM_END) { PARAM_END.len() } else { 0 };
            self.buf.drain(..consumed);
            args(out, index, &fragment);
            self.phase = Phase::XmlParams { index, name, count: count + 1 };
            return Progress::Continue;
        }
        if !at_end && (PARAM.starts_with(t) || FUNC_END.starts_with(t)) {
            self.phase = waiting;
            return Progress::Wait;
        }
        self.junk(waiting)
    }

    /// Drops text that is not a parameter, up to the next tag.
    fn junk(&mut self, phase: Phase) -> Progress {
        let t = self.buf.trim_start();
        let first = t.chars().next().map_or(0, char::len_utf8);
        let skip = (self.buf.len() - t.len()) + t[first..].find('<').map_or(t.len(), |p| p + first);
        self.buf.drain(..skip);
        self.phase = phase;
        Progress::Continue
    }

    fn force_close(&mut self, index: Option<usize>, count: usize) -> Progress {
        self.buf.clear();
        self.phase = Phase::XmlParams { index, name: String::new(), count };
        Progress::Wait
    }
}
