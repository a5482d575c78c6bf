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
    let accessLog: Logger?

    var wantsRequestDetails: Bool { accessLog != nil }

    func exchangeCompleted(_ record: ExchangeRecord) {
        metrics.recordRequest(route: record.route ?? "-", status: record.status, durationNanoseconds: record.durationNanoseconds)
        guard let accessLog else { return }
        accessLog.info("request", metadata: [
            "method": .string(record.method),
            "path": .string(record.path),
            "status": .stringConvertible(record.status),
            "route": .string(record.route ?? "-"),
            "upstream": .string(record.upstream?.description ?? "-"),
            "client": .string(record.client),
            "request_id": .string(record.requestID),
            "duration_ms": .string(String(format3(Double(record.durationNanoseconds) / 1e6))),
            "bytes": .stringConvertible(record.bytesSent),
            "aborted": .stringConvertible(record.aborted),
            "user_agent": .string(record.userAgent ?? "-"),
        ])
    }

    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { metrics.recordUpstreamError(route: route, kind: kind) }
    func clientConnectionOpened() { metrics.clientConnections.increment() }
    func clientConnectionClosed() { metrics.clientConnections.decrement() }
    func upstreamConnectionOpened() { metrics.upstreamConnections.increment() }
    func upstreamConnectionClosed() { metrics.upstreamConnections.decrement() }
}

private func format3(_ value: Double) -> String {
    let scaled = Int((value * 1000).rounded())
    let fraction = String(scaled % 1000)
    return "\(scaled / 1000).\(String(repeating: "0", count: 3 - fraction.count))\(fraction)"
}

/// Writes log records as single lines to standard output: `text` (key=value) or `json`.
/// Used for the access log; values are escaped so a hostile path cannot forge a line.
public struct LineLogHandler: LogHandler {
    public enum Format: Sendable { case text, json }
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    private let label: String
    private let format: Format

    public init(label: String, format: Format) {
        self.label = label
        self.format = format
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
            out = "\(time) \(level) \(message)"
            for key in merged.keys.sorted() {
                out += " \(key)=\(Self.textValue(merged[key]!.description))"
            }
            out += "\n"
        }
        // One write(2) per line: lines from several event loops never interleave.
        var bytes = Array(out.utf8)[...]
        while !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { Glibc.write(1, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            bytes = bytes.dropFirst(n)
        }
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

    static func textValue(_ value: String) -> String {
        let needsQuotes = value.isEmpty || value.unicodeScalars.contains { $0 == " " || $0 == "\"" || $0 == "=" || isControl($0) }
        return needsQuotes ? jsonString(value) : value
    }

    /// C0, DEL, C1 (NEL, 0x85, ends a line for some log tools) and the Unicode line and paragraph
    /// separators: escaped, so a hostile path cannot forge a line for any reader.
    static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (scalar.value >= 0x7f && scalar.value <= 0x9f) || scalar.value == 0x2028 || scalar.value == 0x2029
    }
}
