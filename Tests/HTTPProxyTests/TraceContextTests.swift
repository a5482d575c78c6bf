import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

@Suite("W3C trace context")
struct TraceContextTests {
    static let trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let span = "00f067aa0ba902b7"

    @Test("a valid traceparent is read, and written back the same", arguments: [
        ("00-\(trace)-\(span)-01", true),
        ("00-\(trace)-\(span)-00", false),
        ("00-\(trace)-\(span)-03", true),  // other flags: only `sampled` is read
        ("01-\(trace)-\(span)-01", true),  // a later version, read as 00
        ("cc-\(trace)-\(span)-01-what-the-future-holds", true),
    ])
    func valid(_ value: String, sampled: Bool) throws {
        let context = try #require(TraceContext.parse(traceparent: value, tracestate: nil))
        #expect(context.traceID.hex == Self.trace && context.sampled == sampled)
        #expect(context.traceparent == "00-\(Self.trace)-\(Self.span)-0\(sampled ? 1 : 0)")
    }

    @Test("an invalid traceparent starts a new trace", arguments: [
        ("upper-case hex", "00-4BF92F3577B34DA6A3CE929D0E0E4736-\(span)-01"),
        ("version ff", "ff-\(trace)-\(span)-01"),
        ("trace id of zeros", "00-00000000000000000000000000000000-\(span)-01"),
        ("span id of zeros", "00-\(trace)-0000000000000000-01"),
        ("version 00 with more after it", "00-\(trace)-\(span)-01-extra"),
        ("a later version with more, not after a dash", "01-\(trace)-\(span)-01extra"),
        ("short", "00-\(trace)-\(span)-1"),
        ("a trace id too short", "00-4bf92f3577b34da6a3ce929d0e0e473-\(span)-01"),
        ("not hex", "00-\(trace)-00f067aa0ba902bz-01"),
        ("spaces", " 00-\(trace)-\(span)-01"),
        ("empty", ""),
    ])
    func invalid(_ name: String, _ value: String) {
        #expect(TraceContext.parse(traceparent: value, tracestate: "a=b") == nil, "\(name)")
    }

    @Test("tracestate is kept when well formed, dropped (with the trace kept) when not", arguments: [
        ("congo=t61rcWkgMzE", true),
        ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", true),
        ("rojo=1, congo=2", true),
        ("novalue=", false),
        ("=nokey", false),
        ("no-equals", false),
        ("control=\u{01}", false),
        (String(repeating: "k=v,", count: 33), false),
        ("k=" + String(repeating: "v", count: 520), false),
    ])
    func tracestate(_ value: String, kept: Bool) throws {
        let context = try #require(TraceContext.parse(traceparent: "00-\(Self.trace)-\(Self.span)-01", tracestate: value))
        #expect((context.state == value) == kept)
    }

    @Test("sampling: a trusted caller's decision is kept; a new trace is recorded when its id falls under the ratio", arguments: [
        (1.0, UInt64(0x7fff_ffff_ffff_ffff), nil as Bool?, true),
        (0.0, UInt64(0), nil, false),
        (0.5, UInt64(0x3fff_ffff_ffff_ffff), nil, true),
        (0.5, UInt64(0x4000_0000_0000_0000), nil, false),
        (0.5, UInt64(0xc000_0000_0000_0000), nil, false),  // the top bit is not read
        (0.25, UInt64(0x1fff_ffff_ffff_ffff), nil, true),
        (0.25, UInt64(0x2000_0000_0000_0000), nil, false),
        (0.0, UInt64(1), true, true),
        (1.0, UInt64(1), false, false),
    ])
    func sampling(ratio: Double, low: UInt64, parentSampled: Bool?, sampled: Bool) {
        let id = TraceID(high: 1, low: low)
        let parent = parentSampled.map { TraceContext(traceID: id, spanID: 7, sampled: $0) }
        #expect(TraceSampler(ratio: ratio).samples(id, parent: parent) == sampled)
    }

    // MARK: the header rules

    let tracing = RequestHeaderRules(identityHeaders: [], tracesRequests: true)

    func inspect(_ rules: RequestHeaderRules, _ fields: [(String, String)], trusted: Bool) throws -> InboundRequest {
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/", headers: HTTPHeaders([("Host", "a")] + fields))
        guard case .success(let inbound) = rules.inspect(head, peerTrusted: trusted) else { throw Failure() }
        return inbound
    }

    struct Failure: Error {}

    @Test("traced, a client's traceparent and tracestate never reach the app as sent; a trusted proxy's are read")
    func headerRules() throws {
        let fields = [("TraceParent", "00-\(Self.trace)-\(Self.span)-01"), ("tracestate", "a=1"), ("tracestate", "b=2")]
        let untrusted = try inspect(tracing, fields, trusted: false)
        #expect(untrusted.traceParent == nil && untrusted.traceState == nil)
        #expect(!untrusted.upstreamHeaders.contains(name: "traceparent") && !untrusted.upstreamHeaders.contains(name: "tracestate"))
        let trusted = try inspect(tracing, fields, trusted: true)
        #expect(trusted.traceParent == "00-\(Self.trace)-\(Self.span)-01" && trusted.traceState == "a=1,b=2")
        #expect(!trusted.upstreamHeaders.contains(name: "traceparent"), "the proxy writes its own")
        let twice = try inspect(tracing, [fields[0], fields[0]], trusted: true)
        #expect(twice.traceParent == nil, "two traceparent fields: neither is believed")
    }

    @Test("not traced, traceparent and tracestate pass to the app untouched")
    func untraced() throws {
        let rules = RequestHeaderRules(identityHeaders: [])
        let inbound = try inspect(rules, [("traceparent", "00-\(Self.trace)-\(Self.span)-01"), ("tracestate", "a=1")], trusted: true)
        #expect(inbound.traceParent == nil && inbound.upstreamHeaders["traceparent"] == ["00-\(Self.trace)-\(Self.span)-01"])
        #expect(inbound.upstreamHeaders["tracestate"] == ["a=1"])
    }

    @Test("an exchange's spans continue a trusted caller's trace, or start one; every id is fresh and never 0")
    func exchangeSpans() throws {
        var ids = RequestIDs(seed: 42)
        let caller = try inspect(tracing, [("traceparent", "00-\(Self.trace)-\(Self.span)-01")], trusted: true)
        let continued = ExchangeSpans.start(caller, sampler: TraceSampler(ratio: 0), at: .now()) { ids.nextValue() }
        #expect(continued.context.traceID.hex == Self.trace && continued.parentSpanID == 0x00f0_67aa_0ba9_02b7 && continued.context.sampled)
        let fresh = ExchangeSpans.start(try inspect(tracing, [], trusted: true), sampler: TraceSampler(ratio: 1), at: .now()) { ids.nextValue() }
        #expect(fresh.parentSpanID == nil && fresh.context.traceID.hex != Self.trace && fresh.context.sampled)
        let spans = [fresh.context.spanID, fresh.admissionSpanID, fresh.upstreamSpanID, fresh.connectSpanID]
        #expect(Set(spans).count == 4 && !spans.contains(0))
        #expect(fresh.upstream.traceparent == "00-\(fresh.context.traceID.hex)-\(Hex.string(fresh.upstreamSpanID))-01")
    }
}
