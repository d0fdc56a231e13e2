const n = +process.argv[2];
const arrs = [];
let seed = 42; const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
for (let i = 0; i < n; i++) { const a = new Float64Array(1 << 20); for (let j = 0; j < a.length; j++) a[j] = rnd(); arrs.push(a); }
let s = 0; for (let k = 0; k < 2; k++) for (const a of arrs) for (let j = 0; j < a.length; j++) s += a[j];
const m = new Map(); for (let i = 0; i < 1000000; i++) m.set(i, { v: 'x' + i });
let h = 0; for (let i = 0; i < 1000000; i++) h += m.get(rnd() % 1000000).v.length;
console.log('sum', s, 'h', h);
