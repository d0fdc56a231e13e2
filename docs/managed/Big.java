import java.util.*;
public class Big {
  public static void main(String[] a) {
    int n = Integer.parseInt(a[0]); // millions of longs
    long[][] arrs = new long[n][];
    Random r = new Random(42);
    for (int i = 0; i < n; i++) { arrs[i] = new long[1<<20]; for (int j = 0; j < arrs[i].length; j++) arrs[i][j] = r.nextLong(); }
    long s = 0;
    for (int k = 0; k < 3; k++) for (long[] x : arrs) for (long v : x) s += v;
    // many small objects
    HashMap<Integer,String> m = new HashMap<>();
    for (int i = 0; i < 2_000_000; i++) m.put(i, "v" + i);
    long h = 0; for (int i = 0; i < 2_000_000; i++) h += m.get(r.nextInt(2_000_000)).length();
    Arrays.sort(arrs[0]);
    System.out.println("sum " + s + " h " + h + " first " + arrs[0][0]);
  }
}
