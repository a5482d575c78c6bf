import HTTPProxy

/// One line per exchange on standard output (through `LineSink`: never blocks an event loop).
/// JSON lines carry numbers and booleans as JSON numbers and booleans; text lines are
/// `key=value`. Every value is escaped, so a hostile path or agent cannot forge a line.
struct AccessLog: Sendable {
    let format: LineLogHandler.Format
    let sink: LineSink

    func write(_ r: ExchangeRecord) {
        let upstreamMilliseconds = r.upstreamNanoseconds.map { milliseconds($0) }
        // (key, value, is a string): in text every value is printed as is (escaped when needed).
        let fields: [(String, String, Bool)] = [
            ("method", r.method, true), ("path", r.path, true), ("protocol", r.protocolName, true), ("status", String(r.status), false),
            ("route", r.route ?? "-", true), ("upstream", r.upstream?.description ?? "-", true), ("client", r.client, true),
            ("user", r.user ?? "-", true), ("original", r.original ?? "-", true), ("request_id", r.requestID, true),
            ("trace_id", r.trace?.context.traceID.hex ?? "-", true),
            ("duration_ms", milliseconds(r.durationNanoseconds), false), ("upstream_ms", upstreamMilliseconds ?? (format == .json ? "null" : "-"), false),
            ("bytes", String(r.bytesSent), false), ("aborted", r.aborted ? "true" : "false", false),
            ("user_agent", r.userAgent ?? "-", true),
        ]
        var out: String
        switch format {
        case .json:
            out = "{\"time\":\"\(LineLogHandler.timestamp())\""
            for (key, value, isString) in fields { out += ",\"\(key)\":" + (isString ? LineLogHandler.jsonString(value) : value) }
            out += "}\n"
        case .text:
            out = LineLogHandler.timestamp()
            for (key, value, _) in fields { out += " \(key)=\(LineLogHandler.textValue(value))" }
            out += "\n"
        }
        sink.write(out)
    }

    /// Milliseconds with three decimals.
    private func milliseconds(_ nanoseconds: Int64) -> String {
        let micros = (nanoseconds + 500) / 1000
        let fraction = String(micros % 1000)
        return "\(micros / 1000).\(String(repeating: "0", count: 3 - fraction.count))\(fraction)"
    }
}
