% Octave, for `rmem bench programs`: a square matrix of a third of the data (power iteration,
% a matrix-matrix product of a column block), then a sort of all its elements.
% Arg: MiB of data.
args = argv();
mib = str2double(args{1});
n = floor(sqrt(mib * 2^20 / 8 / 3));
rand("state", 2026);
A = rand(n) - 0.5;
v = ones(n, 1) / sqrt(n);
for i = 1:6
  w = A * v;
  v = w / norm(w);
end
k = min(n, 256);
G = A(:, 1:k)' * A(:, 1:k);
s = sort(A(:));
printf("matrix %d x %d\n", n, n);
printf("power iteration %.6e\n", sum(abs(v)));
printf("gram trace %.8e\n", trace(G));
printf("sorted %.10e %.10e %.10e\n", s(1), s(floor(end / 2)), s(end));
