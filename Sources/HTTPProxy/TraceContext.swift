/// A trace's 128-bit id (W3C Trace Context), never all zeros.
public struct TraceID: Hashable, Sendable {
    public var high: UInt64
    public var low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// 32 lower-case hex digits: the access log's `trace_id`, the id a tracing backend shows.
    public var hex: String { Hex.string(high) + Hex.string(low) }
}

/// Where a span sits in a trace (W3C Trace Context, https://www.w3.org/TR/trace-context/): the
/// trace, the span its children name as their parent, whether the trace is recorded, and the
/// caller's `tracestate`, passed on unchanged.
public struct TraceContext: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: UInt64
    /// The trace is recorded (the `sampled` flag): its spans are exported.
    public var sampled: Bool
    public var state: String?

    public init(traceID: TraceID, spanID: UInt64, sampled: Bool, state: String? = nil) {
        self.traceID = traceID
        self.spanID = spanID
        self.sampled = sampled
        self.state = state
    }

    /// The same trace, with `spanID` as the parent its children name.
    public func child(_ spanID: UInt64) -> TraceContext {
        TraceContext(traceID: traceID, spanID: spanID, sampled: sampled, state: state)
    }

    /// The `traceparent` field naming this span: version 00 (written in place: it goes upstream
    /// with every traced request).
    public var traceparent: String {
        String(unsafeUninitializedCapacity: 55) { out in
            out[0] = UInt8(ascii: "0"); out[1] = UInt8(ascii: "0"); out[2] = UInt8(ascii: "-")
            Hex.write(traceID.high, into: out, at: 3)
            Hex.write(traceID.low, into: out, at: 19)
            out[35] = UInt8(ascii: "-")
            Hex.write(spanID, into: out, at: 36)
            out[52] = UInt8(ascii: "-"); out[53] = UInt8(ascii: "0"); out[54] = sampled ? UInt8(ascii: "1") : UInt8(ascii: "0")
            return 55
        }
    }

    /// A caller's context from its `traceparent` and `tracestate` fields, or nil when
    /// `traceparent` is not valid (then a new trace starts, and `tracestate` is dropped with it).
    ///
    /// Strictness (W3C Trace Context §3.2, §3.3): lower-case hex only; version `ff` and ids of
    /// all zeros are invalid; version 00 is exactly 55 characters; a higher version is read as
    /// 00 when its first 55 characters are, and what follows starts with `-`. A `tracestate` is
    /// kept when it is at most 512 printable ASCII characters (no control character can reach
    /// the app) in at most 32 list members, each a non-empty key `=` a non-empty value — looser
    /// than §3.3's key grammar, which only the caller's vendors read; otherwise it is dropped and
    /// the trace kept.
    public static func parse(traceparent: String, tracestate: String?) -> TraceContext? {
        var value = traceparent
        return value.withUTF8 { bytes -> TraceContext? in
            guard bytes.count >= 55, bytes[2] == UInt8(ascii: "-"), bytes[35] == UInt8(ascii: "-"), bytes[52] == UInt8(ascii: "-"),
                  let version = Hex.value(bytes, 0, 2), version != 0xff,
                  let high = Hex.value(bytes, 3, 16), let low = Hex.value(bytes, 19, 16), high | low != 0,
                  let span = Hex.value(bytes, 36, 16), span != 0,
                  let flags = Hex.value(bytes, 53, 2)
            else { return nil }
            if version == 0 {
                guard bytes.count == 55 else { return nil }
            } else if bytes.count > 55, bytes[55] != UInt8(ascii: "-") {
                return nil
            }
            let state = tracestate.flatMap { isValidState($0) ? $0 : nil }
            return TraceContext(traceID: TraceID(high: high, low: low), spanID: span, sampled: flags & 1 == 1, state: state)
        }
    }

    static func isValidState(_ value: String) -> Bool {
        let utf8 = value.utf8
        guard !utf8.isEmpty, utf8.count <= 512, utf8.allSatisfy({ $0 >= 0x20 && $0 <= 0x7e }) else { return false }
        let members = value.split(separator: ",", omittingEmptySubsequences: true)
        guard members.count <= 32 else { return false }
        return members.allSatisfy { member in
            let trimmed = member.drop { $0 == " " || $0 == "\t" }
            guard let equals = trimmed.firstIndex(of: "=") else { return false }
            return equals != trimmed.startIndex && trimmed.index(after: equals) != trimmed.endIndex
        }
    }
}

/// Whether a new trace is recorded: parent-based, as OpenTelemetry's default sampler is. A
/// trusted caller's decision is kept; a trace the gateway starts is recorded when its id falls
/// under `ratio` (decided from the id's random bits, not by a second draw).
public struct TraceSampler: Sendable, Equatable {
    /// 0 to 1.
    public var ratio: Double

    public init(ratio: Double) { self.ratio = ratio }

    public func samples(_ traceID: TraceID, parent: TraceContext?) -> Bool {
        if let parent { return parent.sampled }
        if ratio >= 1 { return true }
        if ratio <= 0 { return false }
        // The low 63 bits against ratio · 2⁶³ (the idea of OpenTelemetry's TraceIdRatioBased;
        // not bit for bit any SDK's).
        return traceID.low & (UInt64.max >> 1) < UInt64(ratio * 9_223_372_036_854_775_808.0)
    }
}

/// Lower-case hex of 64-bit ids, both ways.
enum Hex {
    static func string(_ value: UInt64) -> String {
        String(unsafeUninitializedCapacity: 16) { out in
            write(value, into: out, at: 0)
            return 16
        }
    }

    /// 16 digits at `offset`.
    @inline(__always)
    static func write(_ value: UInt64, into out: UnsafeMutableBufferPointer<UInt8>, at offset: Int) {
        var value = value
        for i in stride(from: offset + 15, through: offset, by: -1) {
            let digit = UInt8(truncatingIfNeeded: value & 0xF)
            out[i] = digit < 10 ? 0x30 + digit : 0x57 + digit
            value >>= 4
        }
    }

    /// `count` (≤ 16) lower-case hex digits at `start`, or nil when one is not.
    static func value(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ count: Int) -> UInt64? {
        var result: UInt64 = 0
        for i in start..<(start + count) {
            let b = bytes[i]
            let digit: UInt8
            switch b {
            case 0x30...0x39: digit = b - 0x30
            case 0x61...0x66: digit = b - 0x57
            default: return nil
            }
            result = result << 4 | UInt64(digit)
        }
        return result
    }
}
