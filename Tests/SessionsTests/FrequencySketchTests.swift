import Testing

@testable import Sessions

/// The cache's admission policy (issue 27 §4), without a cache: counts, ageing, and the
/// decision as a table.
@Suite("Frequency sketch (cache admission)")
struct FrequencySketchTests {
    /// Keys as the cache makes them from handles: 64 uniform bits.
    static func keys(_ count: Int) -> [UInt64] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in generator.next() }
    }

    struct Row: CustomTestStringConvertible, Sendable {
        var name: String
        /// Lookups of the candidate, the miss that makes it a candidate included.
        var candidate: Int
        var victim: Int
        var admitted: Bool
        var testDescription: String { name }
    }

    @Test(arguments: [
        Row(name: "a one-off is refused, even over an entry never asked for", candidate: 1, victim: 0, admitted: false),
        Row(name: "a session on its second miss takes the place of an entry never asked for", candidate: 2, victim: 0, admitted: true),
        Row(name: "one lookup ahead of the victim (a loop's next entry) is refused", candidate: 3, victim: 2, admitted: false),
        Row(name: "as often as the victim before this miss is refused", candidate: 3, victim: 3, admitted: false),
        Row(name: "more often than the victim before this miss is admitted", candidate: 4, victim: 2, admitted: true),
        Row(name: "beside a saturated victim nothing is admitted", candidate: 40, victim: 30, admitted: false),
    ])
    func admission(_ row: Row) {
        var sketch = FrequencySketch(capacity: 1_000)
        let k = Self.keys(2)
        for _ in 0..<row.candidate { sketch.record(k[0]) }
        for _ in 0..<row.victim { sketch.record(k[1]) }
        #expect(sketch.admits(k[0], over: k[1]) == row.admitted)
    }

    @Test("estimates never under-count, and among few keys are exact")
    func estimatesAreUpperBounds() {
        var sketch = FrequencySketch(capacity: 1_000)
        let k = Self.keys(1_000)
        for (i, key) in k.enumerated() { for _ in 0..<(i % 8) { sketch.record(key) } }
        #expect(k.enumerated().allSatisfy { sketch.estimate($1) >= $0 % 8 })
        let exact = k.enumerated().filter { sketch.estimate($1) == $0 % 8 }.count
        #expect(exact >= 990, "\(exact) of 1,000 exact")
    }

    @Test("counters stop at 15")
    func saturates() {
        var sketch = FrequencySketch(capacity: 1_000)
        let key = Self.keys(1)[0]
        for _ in 0..<100 { sketch.record(key) }
        #expect(sketch.estimate(key) == 15)
    }

    @Test("every ten lookups per entry all counts are halved: what was popular long ago fades")
    func halvesAfterTheSample() {
        var sketch = FrequencySketch(capacity: 100)
        #expect(sketch.sampleSize == 1_000)
        let (old, recent) = (Self.keys(1)[0], Self.keys(1)[0])
        for _ in 0..<14 { sketch.record(old) }
        for _ in 0..<985 { sketch.record(recent) }
        #expect(sketch.estimate(old) == 14 && sketch.estimate(recent) == 15, "999 records: not yet")
        sketch.record(recent)
        #expect(sketch.estimate(old) == 7 && sketch.estimate(recent) == 7)
        #expect(sketch.records == 500)
    }
}
