import HTTPProxy

/// A finished span as the gateway exports it. Times are Unix nanoseconds.
struct SpanRecord: Sendable {
    enum Kind: UInt64, Sendable {
        case `internal` = 1, server = 2, client = 3
    }

    enum Value: Sendable, Equatable {
        case string(String)
        case int(Int64)
        case bool(Bool)
    }

    var traceID: TraceID
    var spanID: UInt64
    var parentSpanID: UInt64?
    var state: String?
    var name: String
    var kind: Kind
    var start: UInt64
    var end: UInt64
    var attributes: [(String, Value)] = []
    /// Named moments within the span (`first_byte`).
    var events: [(name: String, time: UInt64)] = []
    /// Why the span failed (status ERROR), or nil (status UNSET).
    var error: String? = nil
}

/// OTLP's `ExportTraceServiceRequest` in protobuf's wire format
/// (opentelemetry-proto `collector/trace/v1/trace_service.proto`, `trace/v1/trace.proto`): the
/// few messages and fields a span needs, written by hand rather than generated (swift-protobuf's
/// runtime and generator cost minutes of every clean build).
enum OTLPEncoding {
    /// One request: the resource (`service.name`, …), one scope, the spans.
    static func exportRequest(_ spans: some Collection<SpanRecord>, resource: [(String, SpanRecord.Value)], scope: (name: String, version: String)) -> [UInt8] {
        var request = ProtobufWriter()
        request.reserve(spans.count * 320 + 256)
        request.message(1) { resourceSpans in
            resourceSpans.message(1) { r in
                for (key, value) in resource { r.message(1) { keyValue(key, value, into: &$0) } }
            }
            resourceSpans.message(2) { scopeSpans in
                scopeSpans.message(1) { s in
                    s.string(1, scope.name)
                    s.string(2, scope.version)
                }
                for span in spans { scopeSpans.message(2) { write(span, into: &$0) } }
            }
        }
        return request.bytes
    }

    private static func write(_ span: SpanRecord, into w: inout ProtobufWriter) {
        w.bytes(1, bigEndian: [span.traceID.high, span.traceID.low])
        w.bytes(2, bigEndian: [span.spanID])
        if let state = span.state { w.string(3, state) }
        if let parent = span.parentSpanID { w.bytes(4, bigEndian: [parent]) }
        w.string(5, span.name)
        w.varint(6, span.kind.rawValue)
        w.fixed64(7, span.start)
        w.fixed64(8, span.end)
        for (key, value) in span.attributes { w.message(9) { keyValue(key, value, into: &$0) } }
        for event in span.events {
            w.message(11) { e in
                e.fixed64(1, event.time)
                e.string(2, event.name)
            }
        }
        if let error = span.error {
            w.message(15) { s in
                s.string(2, error)
                s.varint(3, 2)  // STATUS_CODE_ERROR
            }
        }
    }

    private static func keyValue(_ key: String, _ value: SpanRecord.Value, into w: inout ProtobufWriter) {
        w.string(1, key)
        w.message(2) { v in
            switch value {
            case .string(let s): v.string(1, s)
            case .bool(let b): v.varint(2, b ? 1 : 0)
            case .int(let i): v.varint(3, UInt64(bitPattern: i))
            }
        }
    }
}

/// Protobuf's wire format, for messages written once: fields in order into one buffer. A nested
/// message is written in place after a one-byte length, moved along when its length needs more
/// bytes (rare: a span, not its many small attributes).
struct ProtobufWriter {
    private(set) var bytes: [UInt8] = []

    mutating func reserve(_ capacity: Int) { bytes.reserveCapacity(capacity) }

    private mutating func tag(_ field: UInt64, _ wireType: UInt64) { rawVarint(field << 3 | wireType) }

    private mutating func rawVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    mutating func varint(_ field: UInt64, _ value: UInt64) {
        tag(field, 0)
        rawVarint(value)
    }

    mutating func fixed64(_ field: UInt64, _ value: UInt64) {
        tag(field, 1)
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    /// 64-bit words as bytes, most significant first (trace and span ids).
    mutating func bytes(_ field: UInt64, bigEndian words: [UInt64]) {
        tag(field, 2)
        rawVarint(UInt64(words.count * 8))
        for word in words { withUnsafeBytes(of: word.bigEndian) { bytes.append(contentsOf: $0) } }
    }

    mutating func string(_ field: UInt64, _ value: String) {
        tag(field, 2)
        rawVarint(UInt64(value.utf8.count))
        bytes.append(contentsOf: value.utf8)
    }

    mutating func message(_ field: UInt64, _ body: (inout ProtobufWriter) -> Void) {
        tag(field, 2)
        let lengthAt = bytes.count
        bytes.append(0)
        body(&self)
        let length = bytes.count - lengthAt - 1
        guard length >= 0x80 else {
            bytes[lengthAt] = UInt8(length)
            return
        }
        var prefix: [UInt8] = []
        var v = UInt64(length)
        while v >= 0x80 {
            prefix.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        prefix.append(UInt8(v))
        bytes.replaceSubrange(lengthAt..<(lengthAt + 1), with: prefix)
    }
}
