import GatewayConfig
import HTTPProxy
import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Turns each finished exchange into one access-log line and the request metrics.
struct GatewayObserver: ProxyObserver {
    let metrics: GatewayMetrics
    let accessLog: AccessLog?

    var wantsRequestDetails: Bool { accessLog != nil }

    func exchangeCompleted(_ record: ExchangeRecord) {
        metrics.recordRequest(route: record.route ?? "-", status: record.status, durationNanoseconds: record.durationNanoseconds)
        accessLog?.write(record)
    }

    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { metrics.recordUpstreamError(route: route, kind: kind) }
    func clientConnectionOpened() { metrics.clientConnections.increment() }
    func clientConnectionClosed() { metrics.clientConnections.decrement() }
    func upstreamConnectionOpened() { metrics.upstreamConnections.increment() }
    func upstreamConnectionClosed() { metrics.upstreamConnections.decrement() }
    func tlsHandshakeFailed(_ reason: TLSHandshakeFailure) { metrics.recordTLSHandshakeFailure(reason) }
    func clientConnectionRefused(_ reason: ConnectionRefusal) { metrics.recordConnectionRefused(reason) }
}

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
            ("method", r.method, true), ("path", r.path, true), ("status", String(r.status), false),
            ("route", r.route ?? "-", true), ("upstream", r.upstream?.description ?? "-", true), ("client", r.client, true),
            ("user", r.user ?? "-", true), ("request_id", r.requestID, true),
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

/// The main log: one line per record on standard error, `text` (`time level message
/// key=value`) or `json`, through `LineSink`. Metadata values are escaped like the access log's.
public struct LineLogHandler: LogHandler {
    public enum Format: String, Sendable { case text, json }
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    private let format: Format
    private let sink: LineSink

    public init(format: Format, level: Logger.Level, sink: LineSink = .standardError) {
        self.format = format
        self.logLevel = level
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        write(level: event.level, message: event.message, metadata: event.metadata)
    }

    public func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        write(level: level, message: message, metadata: explicit)
    }

    private func write(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?) {
        let merged = explicit.map { self.metadata.merging($0) { $1 } } ?? self.metadata
        let time = Self.timestamp()
        var out: String
        switch format {
        case .json:
            out = "{\"time\":\"\(time)\",\"level\":\"\(level)\",\"msg\":\(Self.jsonString(message.description))"
            for key in merged.keys.sorted() {
                out += ",\(Self.jsonString(key)):\(Self.jsonString(merged[key]!.description))"
            }
            out += "}\n"
        case .text:
            out = "\(time) \(level) \(Self.textValue(message.description, quoteSpaces: false))"
            for key in merged.keys.sorted() {
                out += " \(key)=\(Self.textValue(merged[key]!.description))"
            }
            out += "\n"
        }
        sink.write(out)
    }

    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ v: Int32, _ width: Int = 2) -> String { let s = String(v); return String(repeating: "0", count: max(0, width - s.count)) + s }
        let millis = Int32(now.tv_nsec / 1_000_000)
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1))-\(pad(parts.tm_mday))T\(pad(parts.tm_hour)):\(pad(parts.tm_min)):\(pad(parts.tm_sec)).\(pad(millis, 3))Z"
    }

    static func jsonString(_ value: String) -> String {
        var out = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if Self.isControl(scalar) {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }

    /// A value as text: quoted and escaped when it holds a space (unless `quoteSpaces` is off, for
    /// the message), a quote, `=` or a control character.
    static func textValue(_ value: String, quoteSpaces: Bool = true) -> String {
        let needsQuotes = value.isEmpty || value.unicodeScalars.contains { ($0 == " " && quoteSpaces) || $0 == "\"" || $0 == "=" || isControl($0) }
        return needsQuotes ? jsonString(value) : value
    }

    /// C0, DEL, C1 (NEL, 0x85, ends a line for some log tools) and the Unicode line and paragraph
    /// separators: escaped, so a hostile path cannot forge a line for any reader.
    static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (scalar.value >= 0x7f && scalar.value <= 0x9f) || scalar.value == 0x2028 || scalar.value == 0x2029
    }
}
