import GatewayConfig
import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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
                out += ",\(Self.jsonString(key)):\(Self.jsonValue(merged[key]!))"
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

    /// A metadata value as JSON, typed: a number or boolean given as such
    /// (`.stringConvertible(3)`, not `"\(3)"`) is a JSON number or boolean; lists and
    /// dictionaries are JSON arrays and objects; anything else a string.
    static func jsonValue(_ value: Logger.Metadata.Value) -> String {
        switch value {
        case .string(let text): return jsonString(text)
        case .stringConvertible(let v):
            switch v {
            case let b as Bool: return b ? "true" : "false"
            case let n as Int: return String(n)
            case let n as Int64: return String(n)
            case let n as Int32: return String(n)
            case let n as UInt: return String(n)
            case let n as UInt64: return String(n)
            case let n as UInt16: return String(n)
            case let n as Double where n.isFinite: return String(n)
            default: return jsonString(v.description)
            }
        case .array(let items): return "[" + items.map(jsonValue).joined(separator: ",") + "]"
        case .dictionary(let d): return "{" + d.keys.sorted().map { jsonString($0) + ":" + jsonValue(d[$0]!) }.joined(separator: ",") + "}"
        }
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

extension Logger {
    /// A configuration problem as one line: the message is the `file:line:col: error: key: …`
    /// form `check` prints, and the metadata gives each part typed (`file`, `line`, `column`,
    /// `key`, `problem`), so a JSON log reader need not parse the message.
    public func log(_ problem: ConfigProblem, file: String) {
        var metadata: Metadata = ["file": .string(file), "key": .string(problem.path), "problem": .string(problem.message)]
        if let line = problem.line { metadata["line"] = .stringConvertible(line) }
        if let column = problem.column { metadata["column"] = .stringConvertible(column) }
        log(level: problem.severity == .error ? .error : .warning, "\(file):\(problem)", metadata: metadata)
    }
}
